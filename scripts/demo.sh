#!/usr/bin/env bash
# `make demo` (after `make up`): a simulated sale through the edge with stampede-bench —
# 5 000 buyers, browser-like (retries after 429, repeats, a few bots, some picking seats),
# at the open of a sale of 300 standing units and a 10 × 20 seated block — then the audit
# of the invariants, and a demo event left open for a person to buy from in the browser.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
export STACK_DIR=${STACK_DIR:-$ROOT/.stack}
ADMIN=http://127.0.0.1:${ADMIN_PORT:-9091}
EDGE=http://127.0.0.1:${EDGE_PORT:-8080}
OPS=http://127.0.0.1:${OPS_PORT:-8082}
TOKEN=$(cat "$STACK_DIR/admin.token")

cargo build --release --quiet -p stampede-bench
echo "simulated sale: 5 000 buyers at the open (stampede-bench sale)"
"${CARGO_TARGET_DIR:-target}"/release/stampede-bench sale --buyers 5000 --units 300 --seats 10x20 --per-user-limit 2 \
  --connections 128 --plot target/demo-sale.svg
echo "admissions and rejects over time: target/demo-sale.svg"

# An event left on sale for a person, with 20 users whose password is "stampede-demo".
now=$(date -u +%s)
iso() { date -u -d "@$1" +%Y-%m-%dT%H:%M:%SZ; }
admin() {
  curl -sS --fail-with-body -X "$1" "$ADMIN$2" -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' ${3:+--data "$3"}
}
field() { python3 -c 'import json, sys; print(json.load(sys.stdin)[sys.argv[1]])' "$1"; }
id=$(admin POST /admin/events "{\"title\": \"Stampede demo concert\", \"venue\": \"Loopback Arena\",
  \"show_time\": \"$(iso $((now + 86400)))\", \"sale_start\": \"$(iso $((now + 60)))\",
  \"sale_end\": \"$(iso $((now + 7200)))\", \"per_user_limit\": 2, \"pay_timeout_s\": 300,
  \"categories\": [{\"name\": \"Standing\", \"price_cents\": 4900, \"quantity\": 300},
                   {\"name\": \"Seated\", \"price_cents\": 8900, \"seats\": {\"rows\": 10, \"cols\": 20}}]}" | field event_id)
admin POST "/admin/events/$id/publish" >/dev/null
first=$(admin POST /admin/users '{"count": 20, "password": "stampede-demo"}' | field first_user_id)
echo
echo "Event $id opens in a minute: $EDGE/#/event/$id — sign in as user$first … user$((first + 19)), password stampede-demo."
echo "Ops dashboard: $OPS/?event=$id (admin token in $STACK_DIR/admin.token)."
echo "'make status' shows every part; 'make down' stops them."
