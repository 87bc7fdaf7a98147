#!/usr/bin/env bash
# The chaos suite: each experiment is one `stampede-bench sale` through the edge with
# one fault injected mid-burst (--fault), then the bench's audit of the invariants; one
# table row per experiment. Needs a running stack: `make chaos` starts the local one
# (.stack); `make test` runs `--short` against its own test stack.
#
#   scripts/chaos.sh [--short] [experiment ...]
#
# SETTLE_TIMEOUT_S (default 120): how long each sale may take to settle after its burst.
#
# Exits 1 if any experiment oversold, put a seat in two live orders, took a buyer over
# the limit, lost a 202 the durability table does not allow, or broke any other check of
# the audit (conservation, stock synced, paid or cancelled never both).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export STACK_DIR=${STACK_DIR:-$ROOT/.stack}
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
case $TARGET_DIR in /*) ;; *) TARGET_DIR=$ROOT/$TARGET_DIR ;; esac
BENCH=${BENCH:-$TARGET_DIR/release/stampede-bench}
STACK="$ROOT/scripts/stack.sh"
PIDS=$STACK_DIR/pids
# The core's orders.deadline_s (config/stampede.toml): a reservation not an order by then
# is released and its buyer told FAILED. mysql-kill-late keeps MariaDB down past it.
RESERVATION_DEADLINE_S=${RESERVATION_DEADLINE_S:-120}

short=0
if [ "${1:-}" = --short ]; then short=1; shift; fi

# name|the fault (sh -c, run once 300 ms into the burst; empty: none)|lost 202s allowed|
#   more bench options|set-up before the sale (sh -c)
EXPERIMENTS=(
  "redis-kill|kill -9 \$(cat $PIDS/redis.pid); sleep 1; $STACK up redis >/dev/null|0||"
  "redis-rewind|d=$STACK_DIR/redis/appendonlydir; cp -r \$d \$d.aside; sleep 2; kill -9 \$(cat $PIDS/redis.pid); sleep 0.5; rm -rf \$d; mv \$d.aside \$d; $STACK up redis >/dev/null|any|--units 600 --rate 600|"
  "redis-hang|kill -STOP \$(cat $PIDS/redis.pid); sleep 10; kill -CONT \$(cat $PIDS/redis.pid)|0||"
  "mysql-kill|kill -9 \$(cat $PIDS/mysql.pid); sleep 5; $STACK up mysql >/dev/null|0||"
  "mysql-kill-late|kill -9 \$(cat $PIDS/mysql.pid); sleep $((RESERVATION_DEADLINE_S + 5)); $STACK up mysql >/dev/null|0||"
  "mysql-hang|kill -STOP \$(cat $PIDS/mysql.pid); sleep 10; kill -CONT \$(cat $PIDS/mysql.pid)|0||"
  "broker-kill|kill -9 \$(cat $PIDS/broker.pid) \$(cat $PIDS/namesrv.pid); sleep 60; $STACK up namesrv broker >/dev/null|0||"
  "core-kill-x3|for i in 1 2 3; do kill -9 \$(cat $PIDS/core.pid); sleep 0.5; $STACK up core >/dev/null; sleep 2; done|0||"
  "two-cores|kill -9 \$(cat $PIDS/core2.pid)|0||CORES=2 $STACK up core2 edge >/dev/null"
  "pay-race||0|--pay-timeout-s 15 --pay-race 300|"
  "edge-reload|kill -HUP \$(cat $PIDS/edge.pid); sleep 1; $STACK down edge >/dev/null; $STACK up edge >/dev/null|0||"
)
SHORT=(redis-kill redis-hang core-kill-x3 two-cores pay-race)

wanted=("$@")
if [ ${#wanted[@]} -eq 0 ]; then
  if [ $short = 1 ]; then wanted=("${SHORT[@]}"); else
    for e in "${EXPERIMENTS[@]}"; do wanted+=("${e%%|*}"); done
  fi
fi

# The experiments kill the single stack's parts by their pid files.
if [ "$(cat "$STACK_DIR/mode" 2>/dev/null || echo single)" != single ]; then
  echo "chaos: the stack in $STACK_DIR runs STACK_MODE=cluster; the chaos rows are the single stack's (make test-cluster kills a Redis master and a core on the cluster)" >&2
  exit 1
fi
[ -x "$BENCH" ] || { echo "chaos: $BENCH is missing (cargo build --release -p stampede-bench)" >&2; exit 1; }
"$STACK" status >/dev/null || { echo "chaos: the stack in $STACK_DIR is not all up (make up)" >&2; exit 1; }
# A Redis or MariaDB the stack did not start (the machine's own, which `make up` may use)
# has no pid file here: the kills would kill nothing and the rows would prove nothing.
for part in redis mysql; do
  kill -0 "$(cat "$PIDS/$part.pid" 2>/dev/null || echo none)" 2>/dev/null ||
    { echo "chaos: $part in $STACK_DIR is not the stack's own (no live $PIDS/$part.pid): the experiments kill the stack's own; stop the machine's server and run make up again" >&2; exit 1; }
done

# Waits (up to a minute) until the core says it is ready.
ready() {
  local _
  for _ in $(seq 60); do
    curl -fsS -m 2 "http://127.0.0.1:${ADMIN_PORT:-9091}/readyz" >/dev/null 2>&1 && return 0
    sleep 1
  done
  echo "chaos: the core is not ready after a minute" >&2
  return 1
}

# One table row from a sale's JSON report; fails if an invariant broke.
row() {
  python3 - "$@" <<'PY'
import json, sys
path, name, allowed = sys.argv[1], sys.argv[2], sys.argv[3]
try:
    r = json.load(open(path))
except Exception:
    print(f"{name:<14} the sale did not finish: see its stderr"); sys.exit(1)
a = r["audit"]
def count(check):
    return sum(1 for v in a["violations"] if v.startswith(check + ":"))
oversold, seats, limit = count("no oversell"), count("one order per seat"), count("per-user limit")
lost = a["lost_202"]
# Every other check (conservation, stock synced, paid or cancelled) must hold too,
# and the fault must have run: a fault that failed proves nothing.
others = [v for v in a["violations"] if not v.startswith(
    ("no oversell:", "one order per seat:", "per-user limit:", "every 202 terminal:"))]
fault = r.get("fault")
if fault and fault.get("exit") != 0:
    others.append(f"the fault exited {fault.get('exit')}: {fault.get('command')}")
ok = (oversold == 0 and seats == 0 and limit == 0 and not others
      and (allowed == "any" or lost <= int(allowed)))
print(f"{name:<14} {r['admitted']:>8} {r['orders']:>7} {a['failed_202']:>7} {lost:>6} {oversold:>9} "
      f"{seats:>11} {limit:>11} {r['settle_s']:>9.1f} {'ok' if ok else 'FAIL':>6}")
race = r.get("pay_race")
if race:
    print(f"{'':<14} pay race: {race['raced']} payments at the deadline, answered "
          f"{race['answers']}; ended paid {race['ended_paid']}, cancelled {race['ended_cancelled']}")
for v in others[:10]:
    print(f"{'':<14} {v}")
sys.exit(0 if ok else 1)
PY
}

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
printf '%-14s %8s %7s %7s %6s %9s %11s %11s %9s %6s\n' \
  experiment admitted orders FAILED lost oversold "seats twice" "over limit" "settle s" audit
failed=0
for name in "${wanted[@]}"; do
  line=""
  for e in "${EXPERIMENTS[@]}"; do [ "${e%%|*}" = "$name" ] && line=$e; done
  [ -n "$line" ] || { echo "chaos: no experiment $name" >&2; exit 2; }
  IFS='|' read -r _ fault allowed options setup <<<"$line"
  args=()
  [ -z "$fault" ] || args+=(--fault "$fault" --fault-after-ms 300)
  read -ra more <<<"$options"
  args+=("${more[@]}")
  for attempt in 1 2; do
    rm -f "$out/$name.json"
    : >"$out/$name.err"
    if [ -n "$setup" ] && ! sh -c "$setup" >>"$out/$name.err" 2>&1; then
      # No sale: a set-up that failed (no second core) would make the row prove nothing.
      echo "chaos: $name: its set-up failed: $setup" >>"$out/$name.err"
    elif ! ready 2>>"$out/$name.err"; then
      # No sale on a core that never became ready: the row says why, not "no sale".
      echo "chaos: $name: the core was not ready; no sale" >>"$out/$name.err"
    else
      "$BENCH" sale --buyers 3000 --units 400 --categories 2 --seats 5x10 --per-user-limit 2 \
        --connections 64 --max-seconds 90 --quiet-s 0 --settle-timeout-s "${SETTLE_TIMEOUT_S:-120}" --json "${args[@]}" \
        >"$out/$name.json" 2>>"$out/$name.err" || true
    fi
    # The stack as it was before the experiment, whatever the fault left down (a second
    # core stopped, the edge back to one upstream).
    # (CORES=1: the stack remembers the CORES it was last started with.)
    "$STACK" down core2 >/dev/null 2>&1 || true
    if ! CORES=1 "$STACK" up >"$out/$name.restore" 2>&1; then
      echo "chaos: $name: the stack did not come back after the experiment:" >&2
      tail -n 15 "$out/$name.restore" | sed 's/^/    /' >&2
    fi
    # A sale that never ran (the bench could not set it up) is run again, once; a sale
    # that ran is judged as it is.
    if [ -s "$out/$name.json" ] || [ $attempt = 2 ]; then break; fi
    echo "chaos: $name: the sale did not run; again, once. The bench said:" >&2
    sed 's/^/    /' "$out/$name.err" | tail -n 15 >&2
  done
  if ! row "$out/$name.json" "$name" "$allowed"; then
    failed=1
    sed 's/^/    /' "$out/$name.err" | tail -n 15 >&2
  fi
done
exit $failed
