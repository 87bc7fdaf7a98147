#!/usr/bin/env bash
# `make test`'s first step, and `make check`: what a fresh machine must get right, checked
# in seconds without building or starting anything (the first run also makes a venv).
#
#   shell scripts   shellcheck over every one; a warning is fixed, or disabled on its
#                   line with the reason
#   install         `scripts/stack.sh install --dry-run` on a machine with nothing installed
#                   (empty HOME and CARGO_HOME, cargo on PATH or not) plans the RocketMQ
#                   build and the missing Debian packages, exits 0 and changes nothing; a
#                   bad option and a failing step say so, never a silent exit; an install
#                   of redis-server and mariadb-server stops Debian's services for them;
#                   a toolchain without rustfmt gets it from rustup (scripts/rust-components.sh)
#   edge refusals   every status the edge's Lua refuses with has its named location in
#                   openresty/conf/refusals.conf, and respond.lua knows each (a status
#                   without one would be an HTML 500); each constant body there is in
#                   the one form respond.lua reads
#   compose         docker-compose.yml is valid by the Compose specification's JSON schema,
#                   and agrees with the local stack and config/stampede.toml
#                   (scripts/check_compose.py)
#
# The validator comes pinned from PyPI (scripts/check-requirements.txt, with hashes) in
# target/venv-check, made again only when the pins change.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

VENV=$ROOT/target/venv-check
REQUIREMENTS=scripts/check-requirements.txt

ok() { printf '  ok: %s\n' "$*"; }
fail() { printf 'check: %s\n' "$*" >&2; exit 1; }

# apt_install PACKAGE...: as scripts/test.sh installs Chromium (apt-get, as root).
apt_install() {
  [ "$(id -u)" = 0 ] || fail "these checks need the Debian package(s) $* (apt-get install, as root)"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# ---------------------------------------------------------------- shell scripts
# Every file with an sh or bash #! line, or named *.sh, outside build output and stack state.
shell_scripts() {
  find . \( -name .git -o -name target -o -name node_modules -o -name '.stack*' \) -prune \
    -o -type f -print0 |
    xargs -0 -r awk 'FNR == 1 { if (/^#!.*[\/ ](ba|da)?sh([ \t]|$)/ || FILENAME ~ /\.sh$/) print FILENAME; nextfile }' |
    sed 's#^\./##' | sort
}

check_shell_scripts() {
  command -v shellcheck >/dev/null || apt_install shellcheck
  local scripts
  mapfile -t scripts < <(shell_scripts)
  [ ${#scripts[@]} -gt 0 ] || fail "found no shell script (run from the repository)"
  shellcheck "${scripts[@]}" ||
    fail "shellcheck: fix each warning above, or disable it on its line: # shellcheck disable=SCxxxx # why"
  ok "shellcheck, no warning: ${scripts[*]}"
}

# ---------------------------------------------------------------- install
# A machine that never built anything: HOME (so ~/.cargo and ~/.cache) and CARGO_HOME
# empty, the stack's state dir not made yet. The Rust toolchain stays reachable: rustup's
# cargo finds its toolchains through RUSTUP_HOME, whose default is under the real HOME.
# Every run goes through guards first on PATH: apt-get fails (exit 100) and cargo does
# nothing but list (anything else exits 101), so a broken dry run or option check can
# neither install nor build.
fresh=$(mktemp -d)
trap 'rm -rf "$fresh"' EXIT
GUARD=$fresh/guard GUARD_CARGO=$fresh/guard-cargo
on_fresh_machine() {
  env -u ROCKETMQ_BUILD_DIR -u STACK_APT_PACKAGES HOME="$fresh/home" CARGO_HOME="$fresh/cargo" \
    RUSTUP_HOME="${RUSTUP_HOME:-$HOME/.rustup}" STACK_DIR="$fresh/stack" \
    PATH="$GUARD:$GUARD_CARGO:$PATH" "$@"
}
make_guards() {
  mkdir -p "$GUARD" "$GUARD_CARGO"
  printf '#!/bin/sh\necho "check.sh: apt-get refused" >&2\nexit 100\n' >"$GUARD/apt-get"
  local cargo
  if cargo=$(command -v cargo); then
    cat >"$GUARD_CARGO/cargo" <<EOS
#!/bin/sh
[ "\$1 \$2" = "install --list" ] && exec $cargo "\$@"
echo "check.sh: cargo \$* refused" >&2
exit 101
EOS
    chmod +x "$GUARD_CARGO/cargo"
  fi
  chmod +x "$GUARD/apt-get"
}
# Everything under the fresh machine's dirs, with sizes and times: the dry runs' footprint.
footprint() { find "$fresh" -printf '%y %p %s %T@\n' | sort; }

# dry_run WHAT [VAR=VALUE...]: `install --dry-run` with those settings must exit 0; its
# output is left in $plan.
dry_run() {
  local what=$1
  shift
  plan=$(on_fresh_machine env "$@" scripts/stack.sh install --dry-run 2>&1) ||
    fail "install --dry-run failed ($what), exit $?:"$'\n'"$plan"
}
plans_rocketmq_build() {
  grep -qE 'cargo install: .*rocketmq-namesrv@.*rocketmq-broker@' <<<"$plan" ||
    fail "install --dry-run ($1) does not plan to cargo install rocketmq-namesrv and rocketmq-broker:"$'\n'"$plan"
}

# PATH with the apt-get guard but without cargo; fails when cargo shares a directory with the
# system's tools (Debian's cargo in /usr/bin), which the stack cannot do without.
path_without_cargo() {
  local dirs dir path=$GUARD
  IFS=: read -ra dirs <<<"$PATH"
  for dir in "${dirs[@]}"; do
    if [ ! -x "$dir/cargo" ]; then
      path+=:$dir
    elif [ -x "$dir/dpkg-query" ]; then
      return 1
    fi
  done
  printf '%s' "$path"
}

check_install() {
  make_guards
  mkdir -p "$fresh/home" "$fresh/cargo" "$fresh/cargo-other/bin" "$fresh/root"
  # RocketMQ binaries cargo's list does not know (another version, copied in): no match
  # in the list must be an answer, not a failure (the silent exit of issue 11).
  : >"$fresh/cargo-other/.crates.toml"
  : >"$fresh/cargo-other/.crates2.json"
  printf '#!/bin/sh\n' >"$fresh/cargo-other/bin/rocketmq-namesrv-rust"
  printf '#!/bin/sh\n' >"$fresh/cargo-other/bin/rocketmq-broker-rust"
  # For the failing step: `id -u` says root, so that the install goes as far as apt-get.
  # shellcheck disable=SC2016 # $1 and $@ are the fake id's own, expanded when it runs
  printf '#!/bin/sh\n[ "$1" = -u ] && exec echo 0\nexec %s "$@"\n' "$(command -v id)" >"$fresh/root/id"
  chmod +x "$fresh/cargo-other/bin"/* "$fresh/root/id"
  local before no_cargo_path absent=stampede-check-no-such-package
  before=$(footprint)

  dry_run "empty CARGO_HOME and HOME"
  plans_rocketmq_build "empty CARGO_HOME and HOME"
  ok "install --dry-run, empty CARGO_HOME and HOME: plans the RocketMQ build, exit 0"

  dry_run "binaries cargo's list does not know" CARGO_HOME="$fresh/cargo-other"
  plans_rocketmq_build "binaries cargo's list does not know"
  ok "install --dry-run, RocketMQ binaries cargo's list does not know: plans the build, exit 0"

  if no_cargo_path=$(path_without_cargo); then
    dry_run "cargo not on PATH" PATH="$no_cargo_path"
    plans_rocketmq_build "cargo not on PATH"
    ok "install --dry-run, cargo not on PATH: plans the RocketMQ build, exit 0"
  else
    ok "install --dry-run, cargo not on PATH: skipped (cargo shares a directory with dpkg-query)"
  fi

  dry_run "a Debian package not installed" STACK_APT_PACKAGES="bash $absent"
  grep -qE "apt-get install: $absent\$" <<<"$plan" ||
    fail "install --dry-run does not list exactly the missing Debian package $absent (bash is installed):"$'\n'"$plan"
  ok "install --dry-run lists the one Debian package not installed, exit 0"

  # make bench's own tools (wrk): a command not on PATH is missing, `make up` never asks.
  plan=$(on_fresh_machine env STACK_BENCH_TOOLS="bash $absent" scripts/stack.sh install-bench-tools --dry-run 2>&1) ||
    fail "install-bench-tools --dry-run failed, exit $?:"$'\n'"$plan"
  grep -qE "apt-get install: $absent\$" <<<"$plan" ||
    fail "install-bench-tools --dry-run does not list exactly the missing tool $absent (bash is on PATH):"$'\n'"$plan"
  ok "install-bench-tools --dry-run lists the one bench tool not on PATH, exit 0"

  [ "$(footprint)" = "$before" ] ||
    fail "install --dry-run changed files:"$'\n'"$(diff <(printf '%s\n' "$before") <(footprint) || true)"
  ok "install --dry-run changed nothing (HOME, CARGO_HOME, state dir)"

  local out status=0
  out=$(on_fresh_machine scripts/stack.sh install --bogus 2>&1) || status=$?
  if [ "$status" -eq 0 ] || ! grep -q -- --bogus <<<"$out"; then
    fail "install --bogus: wanted an error naming the option, got exit $status:"$'\n'"$out"
  fi
  ok "install --bogus: exit $status, $out"

  # A step that fails: the ERR trap names the step, the exit status and the line of the
  # command, and that line holds the command.
  status=0
  out=$(on_fresh_machine env PATH="$fresh/root:$GUARD:$GUARD_CARGO:$PATH" STACK_APT_PACKAGES=$absent \
    scripts/stack.sh install 2>&1) || status=$?
  local re='stack: failed while "[^"]+" \(exit ([0-9]+), (scripts/[a-z/._-]+) line ([0-9]+): ([^ )]+)'
  if ! [[ $out =~ $re ]] || [ "${BASH_REMATCH[1]}" != "$status" ] ||
    ! sed -n "${BASH_REMATCH[3]}p" "${BASH_REMATCH[2]}" | grep -qF -- "${BASH_REMATCH[4]}"; then
    fail "a failing install step (apt-get exits 100) must be named by the ERR trap:"$'\n'"  stack: failed while \"<step>\" (exit $status, <script> line <n>: <the command on line n>)"$'\n'"got exit $status:"$'\n'"$out"
  fi
  ok "a failing install step is named: ${out##*$'\n'}"

  # A Rust toolchain older than the workspace's rust-version: refused by name before
  # apt-get runs (it used to fail, after the packages, in the build).
  mkdir -p "$fresh/oldrust"
  printf '#!/bin/sh\necho "rustc 1.0.0 (check.sh)"\n' >"$fresh/oldrust/rustc"
  chmod +x "$fresh/oldrust/rustc"
  status=0
  out=$(on_fresh_machine env PATH="$fresh/oldrust:$fresh/root:$GUARD:$GUARD_CARGO:$PATH" \
    STACK_APT_PACKAGES=$absent scripts/stack.sh install 2>&1) || status=$?
  if [ "$status" -eq 0 ] || ! grep -q 'rustc is 1.0.0' <<<"$out" || grep -q 'apt-get refused' <<<"$out"; then
    fail "install with rustc 1.0.0 must stop before apt-get, naming the version; got exit $status:"$'\n'"$out"
  fi
  ok "install with rustc 1.0.0: refused before apt-get, exit $status"

  # Installing redis-server and mariadb-server starts Debian's services on the stack's
  # ports: the install stops and disables both (systemctl), which it finds active. As root
  # (the fake id), the two packages missing (a dpkg-query that knows nothing), apt-get
  # succeeding, RocketMQ's stand-ins in place: nothing else to do, exit 0.
  local distro=$fresh/distro version
  version=$(sed -n 's/^ROCKETMQ_VERSION=//p' scripts/stack.sh)
  mkdir -p "$distro/bin" "$distro/cargo/bin"
  printf '#!/bin/sh\nexit 0\n' >"$distro/bin/apt-get"
  printf '#!/bin/sh\nexit 1\n' >"$distro/bin/dpkg-query"
  cat >"$distro/bin/systemctl" <<EOS
#!/bin/sh
echo "\$*" >>$distro/systemctl.log
EOS
  cat >"$distro/bin/cargo" <<EOS
#!/bin/sh
[ "\$1 \$2" = "install --list" ] || exit 101
printf 'rocketmq-namesrv v$version:\n  rocketmq-namesrv-rust\nrocketmq-broker v$version:\n  rocketmq-broker-rust\n'
EOS
  printf '#!/bin/sh\n' >"$distro/cargo/bin/rocketmq-namesrv-rust"
  printf '#!/bin/sh\n' >"$distro/cargo/bin/rocketmq-broker-rust"
  chmod +x "$distro/bin"/* "$distro/cargo/bin"/*
  status=0
  out=$(on_fresh_machine env PATH="$distro/bin:$fresh/root:$PATH" CARGO_HOME="$distro/cargo" \
    STACK_APT_PACKAGES="redis-server mariadb-server" scripts/stack.sh install 2>&1) || status=$?
  local calls
  calls=$(cat "$distro/systemctl.log" 2>/dev/null || true)
  if [ "$status" -ne 0 ] || ! grep -qx 'disable --now redis-server' <<<"$calls" ||
    ! grep -qx 'disable --now mariadb' <<<"$calls"; then
    fail "installing redis-server and mariadb-server must stop and disable Debian's services (systemctl disable --now redis-server, mariadb); got exit $status, systemctl called with:"$'\n'"$calls"$'\n'"output:"$'\n'"$out"
  fi
  ok "installing redis-server and mariadb-server stops and disables Debian's redis-server and mariadb services"

  # A toolchain without rustfmt (rustup's minimal profile): make test adds it with
  # rustup, and only it; without rustup, an error naming the component.
  local tc=$fresh/toolchain
  mkdir -p "$tc/bin" "$tc/bare"
  cat >"$tc/bin/cargo" <<EOS
#!/bin/sh
[ "\$1" = fmt ] && [ ! -e $tc/rustfmt-added ] && exit 1
exit 0
EOS
  cat >"$tc/bin/rustup" <<EOS
#!/bin/sh
echo "\$*" >>$tc/rustup.log
[ "\$*" = "component add rustfmt" ] && touch $tc/rustfmt-added
exit 0
EOS
  cp "$tc/bin/cargo" "$tc/bare/cargo"
  chmod +x "$tc/bin"/* "$tc/bare/cargo"
  status=0
  out=$(PATH="$tc/bin:/usr/bin:/bin" scripts/rust-components.sh 2>&1) || status=$?
  if [ "$status" -ne 0 ] || [ "$(cat "$tc/rustup.log" 2>/dev/null)" != "component add rustfmt" ]; then
    fail "a toolchain without rustfmt: wanted exactly 'rustup component add rustfmt', exit 0; got exit $status, rustup called with '$(cat "$tc/rustup.log" 2>/dev/null)':"$'\n'"$out"
  fi
  ok "a toolchain without rustfmt: added with rustup (rustup component add rustfmt), exit 0"
  # (Debian's own rustup lives in /usr/bin: then no PATH here is without one.)
  if [ -x /usr/bin/rustup ] || [ -x /bin/rustup ]; then
    ok "a toolchain without rustfmt and without rustup: skipped (rustup is in /usr/bin)"
    return
  fi
  rm -f "$tc/rustfmt-added"
  status=0
  out=$(PATH="$tc/bare:/usr/bin:/bin" scripts/rust-components.sh 2>&1) || status=$?
  if [ "$status" -eq 0 ] || ! grep -q rustfmt <<<"$out"; then
    fail "a toolchain without rustfmt and without rustup must fail naming rustfmt; got exit $status:"$'\n'"$out"
  fi
  ok "a toolchain without rustfmt and without rustup: refused, naming rustfmt"
}

# ---------------------------------------------------------------- compose
venv() {
  if cmp -s "$REQUIREMENTS" "$VENV/requirements.txt" && "$VENV/bin/python" -c '' 2>/dev/null; then
    return 0
  fi
  python3 -c 'import ensurepip, venv' 2>/dev/null || apt_install python3-venv
  python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
    fail "python3 is $(python3 -V 2>&1); the checks need 3.11 or later (tomllib)"
  echo "  making $VENV from $REQUIREMENTS"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check --require-hashes -r "$REQUIREMENTS"
  cp "$REQUIREMENTS" "$VENV/requirements.txt"
}

check_compose() {
  venv
  local out
  out=$("$VENV/bin/check-jsonschema" --builtin-schema vendor.compose-spec docker-compose.yml 2>&1) ||
    fail "docker-compose.yml does not follow the Compose specification:"$'\n'"$out"
  ok "docker-compose.yml follows the Compose specification's schema (check-jsonschema's vendor.compose-spec)"
  "$VENV/bin/python" scripts/check_compose.py >/dev/null ||
    fail "docker-compose.yml disagrees with the local stack (above); fix whichever side is wrong"
  ok "docker-compose.yml agrees with scripts/stack.sh and config/stampede.toml: ports, environment keys, health checks"
}

# Statuses the edge's Lua refuses with (reject(NNN, …), and the gates' `return NNN, "…"`
# and `status, … = NNN`), each with its `location @refuse_NNN` and in respond.lua's list.
check_edge_refusals() {
  local lua=lua/edge/stampede conf=openresty/conf/refusals.conf used status
  used=$(grep -ohE 'reject\([0-9]{3}|return [0-9]{3}, "|status, code, message = [0-9]{3}' "$lua"/*.lua \
    | grep -oE '[0-9]{3}' | sort -u)
  [ -n "$used" ] || fail "no refusal status found in $lua (has reject() changed?)"
  for status in $used; do
    grep -q "^location @refuse_$status " "$conf" || fail "$lua refuses with $status but $conf has no @refuse_$status"
    grep -qE "ipairs\(\{[^}]*\b$status\b" "$lua/respond.lua" || fail "$lua/respond.lua does not list status $status"
  done
  # The constant refusals: respond.lua reads only lines of exactly this form (any other
  # would be skipped silently, its refusal then written from Lua, correct but slower).
  local q="'"
  local per_status="^location @refuse_([0-9]{3}) \\{ return \\1 \\\$stampede_refusal; \\}\$"
  local fixed="^location @[a-z0-9_]+ \\{ return [0-9]{3} $q\\{\"error\":\\{\"code\":\"[A-Z_]+\",\"message\":\"[^\"\\\\\$$q]*\"\\}\\}$q; \\}\$"
  local odd
  odd=$(grep -E '^[[:space:]]*location' "$conf" | grep -vE "$per_status|$fixed" || true)
  [ -z "$odd" ] || fail "$conf: not in the form respond.lua reads: $odd"
  odd=$(grep -E '^location @refuse_' "$conf" | grep -vE "$per_status" || true)
  [ -z "$odd" ] || fail "$conf: @refuse_NNN returns NNN and \$stampede_refusal only: $odd"
  ok "edge refusals: $(echo "$used" | tr '\n' ' ')each with its named location; $(grep -cE "$fixed" "$conf") constant bodies"
}

check_shell_scripts
check_edge_refusals
check_install
check_compose
echo "  all checks passed in ${SECONDS}s"
