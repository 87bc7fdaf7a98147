#!/usr/bin/env bash
# Measures issue 3's two ratios on this machine, everything in one run on the same
# cores: the edge's reject paths (sold out, rate limited) against bare nginx
# `return 200`, and admitted purchases against nginx proxying to a trivial hyper
# backend. Uses the running `make up` stack (it creates its own events and users, and
# restores the edge limits it changes). wrk -t2 -c64, RUNS runs of SECONDS each; medians.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
STACK_DIR=${STACK_DIR:-$ROOT/.stack}
ADMIN=http://127.0.0.1:${ADMIN_PORT:-9091}
EDGE=http://127.0.0.1:${EDGE_PORT:-8080}
RUNS=${RUNS:-3}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-8}
BARE_PORT=18090 PROXY_PORT=18091 BACKEND_PORT=18099
TOKEN=$(cat "$STACK_DIR/admin.token")
WORK=$(mktemp -d)
trap 'kill $(cat "$WORK"/*.pid 2>/dev/null) 2>/dev/null || true; rm -rf "$WORK"' EXIT

command -v wrk >/dev/null || { [ "$(id -u)" = 0 ] && apt-get install -y -qq wrk >/dev/null; }
admin() { curl -fsS -X "$1" "$ADMIN$2" -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' ${3:+--data "$3"}; }
json() { python3 -c 'import json,sys; v=json.load(sys.stdin)
for k in sys.argv[1:]: v = v[int(k)] if k.isdigit() else v[k]
print(v)' "$@"; }

# Baselines: bare nginx, and nginx proxying to a trivial hyper server, both with the
# edge's worker settings.
cargo build --release --quiet -p stampede-core --example trivial_backend
target/release/examples/trivial_backend "127.0.0.1:$BACKEND_PORT" & echo $! >"$WORK/backend.pid"
mkdir -p "$WORK/nginx/logs" "$WORK/nginx/conf"
cat >"$WORK/nginx/conf/nginx.conf" <<CONF
worker_processes auto;
pid logs/nginx.pid;
error_log logs/error.log warn;
events { worker_connections 16384; }
http {
  access_log off;
  keepalive_requests 100000;
  upstream backend { server 127.0.0.1:$BACKEND_PORT; keepalive 256; }
  server { listen 127.0.0.1:$BARE_PORT reuseport; location / { return 200; } }
  server {
    listen 127.0.0.1:$PROXY_PORT reuseport;
    location / { proxy_pass http://backend; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
}
CONF
nginx -p "$WORK/nginx/" -c conf/nginx.conf
sleep 0.5
cp "$WORK/nginx/logs/nginx.pid" "$WORK/nginx.pid"

now=$(date -u +%s)
iso() { date -u -d "@$1" +%Y-%m-%dT%H:%M:%SZ; }
sale() { # sale UNITS → event id, published, selling now
  local id
  id=$(admin POST /admin/events "{\"title\":\"measure\",\"venue\":\"loopback\",\"show_time\":\"$(iso $((now + 86400)))\",
    \"sale_start\":\"$(iso $((now - 60)))\",\"sale_end\":\"$(iso $((now + 3600)))\",\"per_user_limit\":1000,
    \"pay_timeout_s\":600,\"categories\":[{\"name\":\"GA\",\"price_cents\":100,\"quantity\":$1}]}" | json event_id)
  admin POST "/admin/events/$id/publish" >/dev/null
  echo "$id"
}
open_event=$(sale 10000000)
sold_event=$(sale 1)
first=$(admin POST /admin/users '{"count":20000}' | json first_user_id)
admin POST /admin/tokens "{\"first_user_id\":$first,\"count\":20000,\"ttl_s\":3600}" \
  | python3 -c 'import json,sys; print("\n".join(json.load(sys.stdin)["tokens"]))' >"$WORK/tokens"
head -1 "$WORK/tokens" >"$WORK/one-token"
cat_of() { admin GET "/admin/events/$1" | json categories 0 id; }
body_open="{\"category_id\":$(cat_of "$open_event"),\"quantity\":1}"
body_sold="{\"category_id\":$(cat_of "$sold_event"),\"quantity\":1}"
# Sell the one unit, then let the edge learn it.
curl -fsS -o /dev/null -X POST "$EDGE/api/events/$sold_event/orders" -H "Authorization: Bearer $(cat "$WORK/one-token")" \
  -H 'Idempotency-Key: first' -H 'Content-Type: application/json' --data "$body_sold"

limits() { admin PUT /admin/limits "$1" >/dev/null; sleep 1; }
HIGH='{"orders_ip":{"algo":"token_bucket","rate":1e9,"burst":1e9},"orders_user":{"algo":"sliding_window","limit":1e9,"window_s":1},"orders_event":{"algo":"leaky_bucket","rate":1e9,"burst":1e9}}'
RESTORE='{"orders_ip":null,"orders_user":null,"orders_event":null}'

# CPU seconds (user + system) used so far by the processes named, from /proc.
cpu_of() { # cpu_of PATTERN
  local total=0 pid
  for pid in $(pgrep -f "$1"); do
    total=$((total + $(awk '{print $14 + $15}' "/proc/$pid/stat" 2>/dev/null || echo 0)))
  done
  echo "$total"
}
PARTS=("nginx: worker" "stampede serve" "redis-server" "wrk ")

rps() { # rps URL TOKENS BODY: median requests/s of RUNS wrk runs, every path sending the same request
  local url=$1 runs=() i
  for ((i = 0; i < RUNS; i++)); do
    runs+=("$(TOKENS=$2 BODY=$3 wrk -t2 -c64 -d"${SECONDS_PER_RUN}s" -s scripts/wrk-purchase.lua "$url" | awk '/Requests\/sec/ {print $2}')")
  done
  printf '%s\n' "${runs[@]}" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'
}

echo "measuring (wrk -t2 -c64, ${RUNS} × ${SECONDS_PER_RUN}s each, medians) …"
bare=$(rps "http://127.0.0.1:$BARE_PORT/" "$WORK/tokens" "$body_open")
proxy=$(rps "http://127.0.0.1:$PROXY_PORT/" "$WORK/tokens" "$body_open")
limits "$HIGH"
sold=$(rps "$EDGE/api/events/$sold_event/orders" "$WORK/tokens" "$body_sold")
before=(); for p in "${PARTS[@]}"; do before+=("$(cpu_of "$p")"); done
admitted=$(rps "$EDGE/api/events/$open_event/orders" "$WORK/tokens" "$body_open")
split=""; i=0
for p in "${PARTS[@]}"; do split+="$p=$(( $(cpu_of "$p") - before[i] )) "; i=$((i + 1)); done
limits "$RESTORE"
limited=$(rps "$EDGE/api/events/$open_event/orders" "$WORK/one-token" "$body_open")
# What the admitted run really got: units taken from the open event.
taken=$(admin GET "/admin/events/$open_event/stats" | json categories 0 redis_available)
admin POST "/admin/events/$open_event/close" >/dev/null

python3 - "$bare" "$proxy" "$sold" "$limited" "$admitted" "$taken" "$split" <<'PY'
import sys
bare, proxy, sold, limited, admitted = map(float, sys.argv[1:6])
taken = 10_000_000 - int(sys.argv[6])
print(f"{'path':<46}{'req/s':>10}{'ratio':>9}  target")
print(f"{'nginx return 200 (baseline)':<46}{bare:>10.0f}{1:>9.2f}")
print(f"{'edge: sold out → 409':<46}{sold:>10.0f}{sold / bare:>9.2f}  ≥ 0.90 of return 200")
print(f"{'edge: rate limited → 429':<46}{limited:>10.0f}{limited / bare:>9.2f}  ≥ 0.90 of return 200")
print(f"{'nginx → trivial hyper backend (baseline)':<46}{proxy:>10.0f}{1:>9.2f}")
print(f"{'purchases admitted (edge → core → Redis)':<46}{admitted:>10.0f}{admitted / proxy:>9.2f}  ≥ 0.70 of proxy")
print(f"units reserved during the admitted runs: {taken}")
print("CPU ticks (1/100 s) during the admitted runs:", sys.argv[7].strip())
PY
