#!/usr/bin/env bash
# Part of `make test`: the stack uses a Redis it did not start (the distro's service left
# running, another state dir's) only when that Redis keeps the AOF. A Redis like Debian's
# default (appendonly no) answering on REDIS_PORT is refused by name, nothing started or
# written; once it keeps the AOF, `up` uses it and says so, and `down` leaves it running.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

port=${FOREIGN_REDIS_PORT:-26381}
dir=$(mktemp -d)
cli() { redis-cli -h 127.0.0.1 -p "$port" "$@"; }
cleanup() {
  cli shutdown nosave >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT
fail() { printf 'check-foreign-redis: %s\n' "$*" >&2; exit 1; }
stack() { STACK_DIR="$dir/stack" REDIS_PORT=$port scripts/stack.sh "$@" 2>&1; }

if [ "$(cli ping 2>/dev/null || true)" = PONG ]; then fail "port $port is taken; set FOREIGN_REDIS_PORT"; fi
mkdir -p "$dir/foreign"
redis-server --bind 127.0.0.1 --port "$port" --dir "$dir/foreign" --appendonly no --save "" \
  --daemonize yes --pidfile "$dir/foreign/redis.pid" --logfile "$dir/foreign/redis.log"
for _ in $(seq 50); do [ "$(cli ping 2>/dev/null || true)" = PONG ] && break; sleep 0.1; done
cli set check:foreign kept >/dev/null

status=0
out=$(stack up redis) || status=$?
if [ "$status" -eq 0 ] || ! grep -q "appendonly no" <<<"$out"; then
  fail "a Redis with appendonly no on $port must be refused, naming it; got exit $status:"$'\n'"$out"
fi
[ ! -e "$dir/stack/pids/redis.pid" ] || fail "refused, yet a redis.pid was written"
if [ "$(cli get check:foreign)" != kept ] || [ "$(cli dbsize)" != 1 ]; then
  fail "refused, yet the foreign Redis changed (dbsize $(cli dbsize))"
fi
printf '  ok: a Redis the stack did not start, appendonly no: refused, exit %s: %s\n' "$status" "${out##*$'\n'}"

cli config set appendonly yes >/dev/null
out=$(stack up redis) || fail "a Redis with appendonly yes on $port must be used; got:"$'\n'"$out"
grep -q "using a Redis this stack did not start" <<<"$out" ||
  fail "up used a Redis it did not start without saying so:"$'\n'"$out"
stack down redis >/dev/null || fail "down failed"
[ "$(cli get check:foreign)" = kept ] || fail "down stopped or emptied the Redis it did not start"
echo "  ok: a Redis the stack did not start, appendonly yes: used and said so; down leaves it running"
