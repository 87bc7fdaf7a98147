#!/usr/bin/env bash
# Fuzzes the HTTP APIs against docs/openapi.yaml with schemathesis (pinned in
# scripts/fuzz-requirements.txt, installed in target/venv-fuzz), on a running stack:
#
#   1. the public API (the spec's paths under /api/) through the edge, with a user token;
#   2. the admin API (every other path: /admin/..., /metrics, /healthz, /readyz) on the
#      core's admin port, with the admin token from $STACK_DIR/admin.token.
#
# Every operation gets its schema's examples and boundary values (the coverage phase),
# then FUZZ_MAX_EXAMPLES generated cases, valid and invalid (the fuzzing phase), then
# chains of calls linked by the ids one answer hands the next (the stateful phase). The
# checks: all of schemathesis's (scripts/fuzz/schemathesis.toml says how each is set), and
# scripts/fuzz/hooks.py's error_shape: every 4xx answers JSON {"error":{"code","message"}}
# with a documented code. Settings are fixed (seed, one worker, no example database), so
# a run repeats. The edge's rate limits are raised for the run and put back afterwards.
# The fixtures (users, an event on sale, an order) let cases reach past "no such id":
# scripts/fuzz/hooks.py says how. The run mutates the stack (events closed and reopened,
# users created, payments applied): run it after the tests that expect a quiet stack.
#
# Usage: scripts/fuzz-api.sh            (against the test stack, `make test-stack-up`)
# Environment: STACK_DIR (.stack-test), EDGE_PORT (18080), ADMIN_PORT (19091),
#   FUZZ_MAX_EXAMPLES (cases per operation in the fuzzing phase, 100), FUZZ_SEED (1147),
#   FUZZ_WAIT_S (how long to wait for the stack to answer, 60).
# Reports (JUnit XML, and every request and answer as a HAR file) go to target/fuzz/.
# Exits non-zero if any check fails, or the stack or the installation does.
set -Eeuo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

STACK_DIR=${STACK_DIR:-$ROOT/.stack-test}
EDGE=http://127.0.0.1:${EDGE_PORT:-18080}
ADMIN=http://127.0.0.1:${ADMIN_PORT:-19091}
MAX_EXAMPLES=${FUZZ_MAX_EXAMPLES:-100}
# Hypothesis's seed: the same cases in the same order on every run.
SEED=${FUZZ_SEED:-1147}
WAIT_S=${FUZZ_WAIT_S:-60}
SPEC=$ROOT/docs/openapi.yaml
REQUIREMENTS=$ROOT/scripts/fuzz-requirements.txt
CONFIG=$ROOT/scripts/fuzz/schemathesis.toml
VENV=$ROOT/target/venv-fuzz
OUT=$ROOT/target/fuzz
# A bound on each schemathesis run as a whole, whatever happens inside it.
RUN_LIMIT_S=${FUZZ_RUN_LIMIT_S:-300}
# Users whose tokens the purchases rotate over (the core allows one user 5 a second).
BUYERS=40

step() { printf '\n==> %s\n' "$*"; }
die() {
  printf 'fuzz-api: %s\n' "$*" >&2
  exit 1
}
trap 'die "failed at line $LINENO: $BASH_COMMAND"' ERR

# The venv, made anew only when the requirements (or the Python) changed since the last.
install() {
  local want
  want="$(sha256sum "$REQUIREMENTS" | cut -d' ' -f1) $(python3 -c 'import sys; print(sys.version.split()[0])')"
  if [ -x "$VENV/bin/schemathesis" ] && [ "$(cat "$VENV/.requirements.sha256" 2>/dev/null)" = "$want" ]; then
    return
  fi
  step "installing schemathesis in ${VENV#"$ROOT"/} (scripts/fuzz-requirements.txt changed)"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps --require-hashes -r "$REQUIREMENTS"
  echo "$want" >"$VENV/.requirements.sha256"
}

# Waits until the edge and the core's admin port answer their health checks.
wait_for_stack() {
  local deadline=$((SECONDS + WAIT_S))
  until curl -fs -o /dev/null --max-time 2 "$EDGE/edge/health" && curl -fs -o /dev/null --max-time 2 "$ADMIN/healthz"; do
    [ "$SECONDS" -lt "$deadline" ] || die "the stack does not answer at $EDGE/edge/health and $ADMIN/healthz (start it: make test-stack-up)"
    sleep 1
  done
}

# An admin call: METHOD PATH [JSON BODY] → the answer's body; fails on anything but 2xx.
# A core restarting under us refuses connections for a moment: retried for up to ~60 s.
admin() {
  local args=(-sS --fail-with-body --max-time 30 --retry 30 --retry-connrefused --retry-delay 2
    -X "$1" -H "Authorization: Bearer $ADMIN_TOKEN")
  [ $# -lt 3 ] || args+=(-H 'Content-Type: application/json' --data-binary "$3")
  curl "${args[@]}" "$ADMIN$2"
}

# Reads JSON on stdin and prints the Python expression $1 over it (as `d`).
json() { "$VENV/bin/python" -c "import json, sys; d = json.load(sys.stdin); print($1)"; }

# The edge's limits, raised for the run: one user and one address send every case, far
# faster than a buyer. Put back on the way out, fuzzed overrides removed with them.
SAVED_LIMITS=
raise_limits() {
  SAVED_LIMITS=$(admin GET /admin/limits)
  admin PUT /admin/limits '{
    "orders_ip": {"algo": "token_bucket", "rate": 1000000, "burst": 1000000},
    "orders_user": {"algo": "sliding_window", "limit": 1000000, "window_s": 1},
    "orders_event": {"algo": "leaky_bucket", "rate": 1000000, "burst": 1000000},
    "api_ip": {"algo": "fixed_window", "limit": 1000000, "window_s": 1},
    "api_user": {"algo": "token_bucket", "rate": 1000000, "burst": 1000000},
    "login_ip": {"algo": "fixed_window", "limit": 1000000, "window_s": 60}}' >/dev/null
  sleep 1.5 # every edge worker reads overrides within a second
}
restore_limits() {
  [ -n "$SAVED_LIMITS" ] || return 0
  local now body
  now=$(admin GET /admin/limits) || return 1
  # Every name stored now: its value from before the run, or null (removed).
  body=$(printf '%s\n%s\n' "$SAVED_LIMITS" "$now" | "$VENV/bin/python" -c '
import json, sys
before, now = (json.loads(line)["limits"] for line in sys.stdin)
print(json.dumps({name: before.get(name) for name in {**before, **now}}))')
  if [ "$body" != "{}" ]; then admin PUT /admin/limits "$body" >/dev/null || return 1; fi
  SAVED_LIMITS=
}
on_exit() {
  local rc=$?
  trap - ERR
  restore_limits || { echo "fuzz-api: could not restore the edge's limits" >&2; rc=1; }
  exit "$rc"
}

# One schemathesis run: NAME URL and the filter options.
FAILED=()
PASSED=()
fuzz() {
  local name=$1 url=$2
  shift 2
  step "schemathesis: $name API at $url ($MAX_EXAMPLES cases per operation, seed $SEED)"
  rm -rf "${OUT:?}/$name"
  local rc=0
  mkdir -p "$OUT/$name"
  # Run from the report directory: Hypothesis keeps a .hypothesis/ in the working one.
  (cd "$OUT/$name" && SCHEMATHESIS_HOOKS=$ROOT/scripts/fuzz/hooks.py FUZZ_SPEC=$SPEC \
    FUZZ_ADMIN_TOKEN=$ADMIN_TOKEN FUZZ_USER_TOKEN=$USER_TOKEN FUZZ_BUYER_TOKENS=$BUYER_TOKENS \
    FUZZ_EVENT_ID=$EVENT_ID FUZZ_CATEGORY_IDS=$CATEGORY_IDS FUZZ_ORDER_NO=$ORDER_NO \
    FUZZ_ORDER_AMOUNT=$ORDER_AMOUNT FUZZ_PROVIDER_SECRET_FILE=$STACK_DIR/provider.secret \
    timeout --kill-after=10 "$RUN_LIMIT_S" \
    "$VENV/bin/schemathesis" --config-file "$CONFIG" run "$SPEC" --url "$url" "$@" \
    --max-examples "$MAX_EXAMPLES" --seed "$SEED" --report junit,har --report-dir .) || rc=$?
  if [ "$rc" -eq 0 ]; then PASSED+=("$name"); else
    [ "$rc" -ne 124 ] || echo "fuzz-api: the $name run took over ${RUN_LIMIT_S} s and was stopped" >&2
    FAILED+=("$name")
  fi
}

started=$SECONDS
install
step "waiting for the stack (edge $EDGE, admin $ADMIN)"
wait_for_stack
[ -r "$STACK_DIR/admin.token" ] || die "no admin token at $STACK_DIR/admin.token"
ADMIN_TOKEN=$(tr -d '[:space:]' <"$STACK_DIR/admin.token")

step "fixtures: users and their tokens, an event on sale now, an order"
# user<first> is the run's user (a password, for login); the others buy (rotated).
users=$(admin POST /admin/users "{\"count\": $((BUYERS + 1)), \"password\": \"fuzz-password-1\"}")
first_user=$(json 'd["first_user_id"]' <<<"$users")
tokens=$(admin POST /admin/tokens "{\"first_user_id\": $first_user, \"count\": $((BUYERS + 1)), \"ttl_s\": 3600}")
USER_TOKEN=$(json 'd["tokens"][0]' <<<"$tokens")
BUYER_TOKENS=$(json '",".join(d["tokens"][1:])' <<<"$tokens")
now=$(date -u +%s)
iso() { date -u -d "@$1" +%Y-%m-%dT%H:%M:%SZ; }
created=$(admin POST /admin/events "{\"title\": \"Fuzz fixture\", \"venue\": \"Hall\",
  \"show_time\": \"$(iso $((now + 86400)))\", \"sale_start\": \"$(iso $((now - 60)))\",
  \"sale_end\": \"$(iso $((now + 3600)))\", \"per_user_limit\": 4, \"pay_timeout_s\": 900,
  \"categories\": [{\"name\": \"GA\", \"price_cents\": 5000, \"quantity\": 100000},
                   {\"name\": \"Seated\", \"price_cents\": 9000, \"seats\": {\"rows\": 10, \"cols\": 20}}]}")
EVENT_ID=$(json 'd["event_id"]' <<<"$created")
CATEGORY_IDS=$(json '",".join(str(c["id"]) for c in d["categories"])' <<<"$created")
admin POST "/admin/events/$EVENT_ID/publish" >/dev/null
# One unit bought by the run's user through the edge, once the order exists: an UNPAID
# order to read, pay and cancel. Without one those operations would be fuzzed with
# generated order numbers only (404s), so a 202 that is no order within a minute fails
# the run.
ORDER_NO='' ORDER_AMOUNT=''
# The edge learns of the sale from Redis within a second: NOT_OPEN until then.
for try in $(seq 1 20); do
  queued=$(curl -s --fail-with-body --max-time 10 -X POST -H "Authorization: Bearer $USER_TOKEN" \
    -H "Idempotency-Key: fuzz-fixture-$now" -H 'Content-Type: application/json' \
    --data-binary "{\"category_id\": ${CATEGORY_IDS%%,*}, \"quantity\": 1}" "$EDGE/api/events/$EVENT_ID/orders") && break
  [ "$try" -lt 20 ] || die "the fixture purchase was refused: $queued"
  sleep 0.25
done
for _ in $(seq 1 120); do
  status=$(curl -sS --max-time 5 -H "Authorization: Bearer $USER_TOKEN" "$EDGE/api/events/$EVENT_ID/orders/status" || true)
  ORDER_NO=$(json 'd.get("order_no", "") if d.get("status") == "CREATED" else ""' <<<"$status" 2>/dev/null || true)
  [ -z "$ORDER_NO" ] || break
  sleep 0.5
done
[ -n "$ORDER_NO" ] ||
  die "the fixture purchase was admitted ($queued) but no order came of it within 60 s (status: $status); pay, cancel and the order's view would be fuzzed on made-up numbers only"
ORDER_AMOUNT=$(curl -sS --fail-with-body --max-time 5 -H "Authorization: Bearer $USER_TOKEN" "$EDGE/api/orders/$ORDER_NO" |
  json 'd["amount_cents"]')
echo "user$first_user and $BUYERS buyers; event $EVENT_ID (categories $CATEGORY_IDS); order ${ORDER_NO:-none}"

step "raising the edge's rate limits for the run"
trap on_exit EXIT
raise_limits

# Not POST /api/logout: it would sign the run's user out, and every later case of the
# user's would be 401 (the e2e suite covers it: edge::a_signed_out_token_…).
fuzz public "$EDGE" --include-path-regex '^/api/' --exclude-path /api/logout
fuzz admin "$ADMIN" --exclude-path-regex '^/api/'

step "putting the edge's rate limits back"
restore_limits

verdict=OK
[ ${#FAILED[@]} -eq 0 ] || verdict=FAILED
printf '\nfuzz-api: %s in %d s; passed: %s; failed: %s (reports in %s)\n' \
  "$verdict" $((SECONDS - started)) "${PASSED[*]:-none}" "${FAILED[*]:-none}" "${OUT#"$ROOT"/}"
[ ${#FAILED[@]} -eq 0 ] || exit 1
