#!/usr/bin/env bash
# Part of `make test`: the stack starts as a user that is not root, as the README says
# (only installing needs root). As root it becomes `nobody` (setpriv) with an ordinary
# user's PATH (no /usr/sbin), and starts the stack's Redis and MariaDB on ports of their
# own in a state dir of their own; then stops them and removes everything. The install
# step it passes through finds nothing to do: its toolchain check is given a stand-in
# cargo and rustc (nobody cannot read root's toolchain), RocketMQ stand-ins in place.
# As any other user it is skipped: that user is the case already.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

if [ "$(id -u)" != 0 ]; then
  echo "  skipped: not root (this user is the unprivileged case)"
  exit 0
fi
command -v setpriv >/dev/null || { echo "check-unprivileged: setpriv (util-linux) is missing" >&2; exit 1; }

# nobody must reach the checkout: one under a private directory (/root is 0700) cannot
# run the stack as anyone but its owner (the edge says so too: scripts/stack/edge.sh).
if ! setpriv --reuid=nobody --regid=nogroup --clear-groups test -r "$ROOT/scripts/stack.sh"; then
  echo "check-unprivileged: user nobody cannot read $ROOT/scripts/stack.sh: a directory above the checkout is private; put it where others may read it (e.g. /opt or /srv)" >&2
  exit 1
fi

dir=$(mktemp -d)
chmod 0755 "$dir"
as_nobody() {
  env -i HOME="$dir/home" PATH="$dir/bin:/usr/local/bin:/usr/bin:/bin" CARGO_HOME="$dir/cargo" \
    STACK_DIR="$dir/stack" REDIS_PORT=26379 MYSQL_PORT=23306 \
    setpriv --reuid=nobody --regid=nogroup --clear-groups "$@"
}
cleanup() {
  as_nobody scripts/stack.sh down redis mysql >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT

mkdir -p "$dir/bin" "$dir/cargo/bin" "$dir/home" "$dir/stack"
rust_min=$(sed -n 's/^rust-version = "\(.*\)"$/\1/p' Cargo.toml)
printf '#!/bin/sh\necho "rustc %s (check-unprivileged stand-in)"\n' "$rust_min" >"$dir/bin/rustc"
cat >"$dir/bin/cargo" <<EOS
#!/bin/sh
[ "\$1 \$2" = "install --list" ] && printf 'rocketmq-namesrv v$(sed -n 's/^ROCKETMQ_VERSION=//p' scripts/stack.sh):\n  rocketmq-namesrv-rust\nrocketmq-broker v$(sed -n 's/^ROCKETMQ_VERSION=//p' scripts/stack.sh):\n  rocketmq-broker-rust\n'
exit 0
EOS
touch "$dir/cargo/bin/rocketmq-namesrv-rust" "$dir/cargo/bin/rocketmq-broker-rust"
chmod 0755 "$dir/bin/"* "$dir/cargo/bin/"*
chown nobody "$dir/home" "$dir/stack"

if ! out=$(as_nobody scripts/stack.sh up redis mysql 2>&1); then
  printf 'check-unprivileged: the stack did not start as nobody:\n%s\n' "$out" >&2
  # The logs go with the state dir on the way out: their last lines now.
  for log in "$dir"/stack/logs/*; do
    [ -f "$log" ] && { printf '\n==> %s\n' "${log##*/}"; tail -n 20 "$log"; } >&2
  done
  exit 1
fi
printf '%s\n' "$out" | sed 's/^/  /'
# `status` lists every part (the others are not started here): these two must be up.
status=$(as_nobody scripts/stack.sh status 2>&1 || true)
for part in redis mysql; do
  grep -qE "^$part +[0-9]+ +[0-9]+ +up\b" <<<"$status" ||
    { printf 'check-unprivileged: %s started as nobody, but is not up:\n%s\n' "$part" "$status" >&2; exit 1; }
done
echo "  ok: Redis and MariaDB start and answer as nobody, without /usr/sbin on PATH"
