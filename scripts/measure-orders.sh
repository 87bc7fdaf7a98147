#!/usr/bin/env bash
# Measures the order pipeline on the running `make up` stack (issue 4's targets):
#  1. sustained: wrk admits purchases through the edge for SECONDS; orders persisted per
#     second = orders in MySQL (with stock_log synced) / time from start to settled;
#  2. burst: BUYERS buyers (one request each) for UNITS units; the time from the last
#     request until every order is in MySQL, stock_log synced and remain = 0.
# Creates its own events and users; restores the edge limits it raises.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
STACK_DIR=${STACK_DIR:-$ROOT/.stack}
ADMIN=http://127.0.0.1:${ADMIN_PORT:-9091}
EDGE=http://127.0.0.1:${EDGE_PORT:-8080}
SECONDS_SUSTAINED=${SECONDS_SUSTAINED:-10}
BUYERS=${BUYERS:-200000}
UNITS=${UNITS:-10000}
TOKEN=$(cat "$STACK_DIR/admin.token")
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

admin() { curl -fsS -X "$1" "$ADMIN$2" -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' ${3:+--data "$3"}; }
json() { python3 -c 'import json,sys; v=json.load(sys.stdin)
for k in sys.argv[1:]: v = v[int(k)] if k.isdigit() else v[k]
print(v)' "$@"; }
now_s() { date +%s.%N; }
now=$(date -u +%s)
iso() { date -u -d "@$1" +%Y-%m-%dT%H:%M:%SZ; }
sale() { # sale UNITS LIMIT → event id
  local id
  id=$(admin POST /admin/events "{\"title\":\"measure orders\",\"venue\":\"loopback\",\"show_time\":\"$(iso $((now + 86400)))\",
    \"sale_start\":\"$(iso $((now - 60)))\",\"sale_end\":\"$(iso $((now + 3600)))\",\"per_user_limit\":$2,
    \"pay_timeout_s\":600,\"categories\":[{\"name\":\"GA\",\"price_cents\":100,\"quantity\":$1}]}" | json event_id)
  admin POST "/admin/events/$id/publish" >/dev/null
  echo "$id"
}
settled() { # settled EVENT: queued 0, nothing unsynced
  local stats
  stats=$(admin GET "/admin/events/$1/stats")
  [ "$(json queued_reservations <<<"$stats")" = 0 ] && [ "$(json unsynced_stock_log <<<"$stats")" = 0 ]
}
wait_settled() { # wait_settled EVENT → seconds waited (to 0.5 s; gives up after 120 s)
  local start i
  start=$(now_s)
  for ((i = 0; i < 240; i++)); do settled "$1" && break; sleep 0.5; done
  python3 -c "print(f'{$(now_s) - $start:.2f}')"
}

admin PUT /admin/limits '{"orders_ip":{"algo":"token_bucket","rate":1e9,"burst":1e9},"orders_user":{"algo":"sliding_window","limit":1e9,"window_s":1},"orders_event":{"algo":"leaky_bucket","rate":1e9,"burst":1e9}}' >/dev/null
trap 'admin PUT /admin/limits "{\"orders_ip\":null,\"orders_user\":null,\"orders_event\":null}" >/dev/null; rm -rf "$WORK"' EXIT
sleep 1

echo "== sustained: admitted purchases for ${SECONDS_SUSTAINED}s, persisted through the pipeline"
open_event=$(sale 10000000 1000)
first=$(admin POST /admin/users '{"count":20000}' | json first_user_id)
admin POST /admin/tokens "{\"first_user_id\":$first,\"count\":20000,\"ttl_s\":3600}" \
  | python3 -c 'import json,sys; print("\n".join(json.load(sys.stdin)["tokens"]))' >"$WORK/tokens"
cat_id=$(admin GET "/admin/events/$open_event" | json categories 0 id)
start=$(now_s)
TOKENS=$WORK/tokens BODY="{\"category_id\":$cat_id,\"quantity\":1}" \
  wrk -t2 -c64 -d"${SECONDS_SUSTAINED}s" -s scripts/wrk-purchase.lua "$EDGE/api/events/$open_event/orders" >"$WORK/wrk1"
sent_end=$(now_s)
tail_s=$(wait_settled "$open_event")
stats=$(admin GET "/admin/events/$open_event/stats")
orders=$(json categories 0 unpaid <<<"$stats")
python3 - "$start" "$sent_end" "$tail_s" "$orders" <<'PY'
import sys
start, end, tail, orders = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
total = end - start + tail
print(f"orders persisted (units in UNPAID orders, stock_log synced): {orders}")
print(f"admission ran {end - start:.1f} s; settled {tail:.2f} s after the last request")
print(f"orders persisted per second, start to settled: {orders / total:,.0f}  (target ≥ 20,000)")
PY
admin POST "/admin/events/$open_event/close" >/dev/null

echo "== burst: $BUYERS buyers, one request each, for $UNITS units"
burst_event=$(sale "$UNITS" 1)
first=$(admin POST /admin/users "{\"count\":$BUYERS}" | json first_user_id)
: >"$WORK/burst-tokens"
for ((from = first; from < first + BUYERS; from += 200000)); do
  n=$((first + BUYERS - from < 200000 ? first + BUYERS - from : 200000))
  admin POST /admin/tokens "{\"first_user_id\":$from,\"count\":$n,\"ttl_s\":3600}" \
    | python3 -c 'import json,sys; print("\n".join(json.load(sys.stdin)["tokens"]))' >>"$WORK/burst-tokens"
done
cat_id=$(admin GET "/admin/events/$burst_event" | json categories 0 id)
# wrk has no request count: run until every token was used once (stop at the last).
cat >"$WORK/once.lua" <<'LUA'
local tokens = {}
for line in io.lines(os.getenv("TOKENS")) do tokens[#tokens + 1] = line end
local body = os.getenv("BODY")
local threads, sent, answered, id = 2, 0, 0, 0
setup = function(thread) thread:set("id", id); id = id + 1 end
request = function()
  local i = math.min(sent * threads + id + 1, #tokens)
  sent = sent + 1
  return wrk.format("POST", nil, {
    ["Authorization"] = "Bearer " .. tokens[i],
    ["Idempotency-Key"] = "burst",
    ["Content-Type"] = "application/json",
  }, body)
end
-- Each thread stops after its share of the buyers (wrk stops threads only from here).
response = function()
  answered = answered + 1
  if answered >= #tokens / threads then wrk.thread:stop() end
end
LUA
start=$(now_s)
TOKENS=$WORK/burst-tokens BODY="{\"category_id\":$cat_id,\"quantity\":1}" \
  wrk -t2 -c64 -d120s -s "$WORK/once.lua" "$EDGE/api/events/$burst_event/orders" >"$WORK/wrk2"
sent_end=$(now_s)
tail_s=$(wait_settled "$burst_event")
stats=$(admin GET "/admin/events/$burst_event/stats")
python3 - "$start" "$sent_end" "$tail_s" "$stats" "$UNITS" <<'PY'
import json, sys
start, end, tail, stats, units = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), json.loads(sys.argv[4]), int(sys.argv[5])
c = stats["categories"][0]
print(f"requests sent in {end - start:.1f} s; settled {tail:.2f} s after the last one  (target ≤ 5 s)")
print(f"units in orders {c['unpaid']} of {units}; Redis left {c['redis_available']}; MySQL remain {c['db_remain']}")
PY
admin POST "/admin/events/$burst_event/close" >/dev/null
