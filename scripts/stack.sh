#!/usr/bin/env bash
# The local stack as plain processes on 127.0.0.1: Redis, MariaDB, the RocketMQ name
# server and broker, the Stampede core, and the nginx + Lua edge.
#
#   scripts/stack.sh install          install what is missing (apt-get, cargo install)
#   scripts/stack.sh install --dry-run   print what `install` would install and build; change nothing
#   scripts/stack.sh install-bench-tools [--dry-run]   what `make bench` needs besides the
#                                     stack (wrk), apt-get installed when not on PATH
#   scripts/stack.sh up [PART...]     install, then start what is not running
#   scripts/stack.sh down [PART...]   stop what `up` started (pid files), newest first
#   scripts/stack.sh status           every part with its port, pid and health
#   scripts/stack.sh rotate-token-secret   a new user-token secret; the previous stays valid
#
# Parts: redis mysql namesrv broker core paysim edge, and core2 with CORES=2.
# STACK_MODE=cluster: a Redis Cluster (part rediscluster: 3 masters, 3 replicas) in
# place of redis, two cores and two edges (edge2); docs/scaling.md.
# Idempotent: `up` twice changes nothing, and a part already answering on its port is
# reused. A port held by something else is an error naming the port. State (data, logs, pids, generated secrets) lives under
# $STACK_DIR (default .stack/). Every setting below can be overridden from the
# environment; the test harness runs a second stack with its own dir and ports.
set -Eeuo pipefail
# Never a silent exit: a failing command names the step it was part of and its line.
step="read the settings"
on_err() { # on_err STATUS LINE COMMAND FILE
  [ "$BASH_SUBSHELL" -eq 0 ] || return 0 # reported once, by the shell that runs the step
  printf 'stack: failed while "%s" (exit %s, %s line %s: %s)\n' "$step" "$1" "${4#"$ROOT"/}" "$2" "$3" >&2
}
trap 'on_err $? $LINENO "$BASH_COMMAND" "${BASH_SOURCE[0]}"' ERR

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# Every part started here may hold as many files open as the hard limit allows: a
# shell's usual 1 024 would cap the edge (two descriptors per proxied connection) and
# the core far below their connection settings.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
# mariadbd and nginx are in /usr/sbin, not on an ordinary user's PATH on Debian.
case ":$PATH:" in *:/usr/sbin:*) ;; *) PATH=$PATH:/usr/sbin:/sbin ;; esac
STACK_DIR=${STACK_DIR:-$ROOT/.stack}
PARTS_DEFAULT="redis mysql namesrv broker core paysim edge"
# single (one Redis) or cluster (a Redis Cluster, two cores, two edges).
# The mode `up` last started the state dir in is remembered, so `make status` and
# `make down` without STACK_MODE speak of the stack that runs.
MODE_FILE=$STACK_DIR/mode
STACK_MODE=${STACK_MODE:-$(cat "$MODE_FILE" 2>/dev/null || echo single)}

EDGE_PORT=${EDGE_PORT:-8080}
CORE_PORT=${CORE_PORT:-8081}
ADMIN_PORT=${ADMIN_PORT:-9091}
# The edge's loopback-only ops dashboard, and the payment provider simulator's page.
OPS_PORT=${OPS_PORT:-8082}
PAYSIM_PORT=${PAYSIM_PORT:-8090}
# Cores serving the sales: 1, or 2 (the second, part core2, on CORE2_PORT and ADMIN2_PORT,
# with the same Redis, MariaDB and broker; the edge spreads the public API over both).
# Remembered like STACK_MODE (state dir's `cores`), so `make status` and a restart of one
# part speak of the second core too.
CORES_FILE=$STACK_DIR/cores
CORES=${CORES:-$(cat "$CORES_FILE" 2>/dev/null || echo 1)}
CORE2_PORT=${CORE2_PORT:-$((CORE_PORT + 2))}
ADMIN2_PORT=${ADMIN2_PORT:-$((ADMIN_PORT + 2))}
REDIS_PORT=${REDIS_PORT:-6379}
# STACK_MODE=cluster: the cluster's six nodes on REDIS_CLUSTER_PORT … +5 (the first three
# start as masters), the second edge on EDGE2_PORT with its ops dashboard on OPS2_PORT.
REDIS_CLUSTER_PORT=${REDIS_CLUSTER_PORT:-7001}
EDGE2_PORT=${EDGE2_PORT:-$((EDGE_PORT + 4))}
OPS2_PORT=${OPS2_PORT:-$((OPS_PORT + 4))}
MYSQL_PORT=${MYSQL_PORT:-3306}
# Redis's AOF fsync: always (an admission is on disk before its 202; the default, chosen
# from make bench: it costs about a sixth of admissions/s) or everysec (an OS crash may
# lose about the last second of admissions; see README "What a 202 survives"). Applies
# when Redis starts.
REDIS_APPENDFSYNC=${REDIS_APPENDFSYNC:-always}
NAMESRV_PORT=${NAMESRV_PORT:-9876}
BROKER_PORT=${BROKER_PORT:-10911}
MYSQL_DATABASE=${MYSQL_DATABASE:-stampede}
MYSQL_USER=${MYSQL_USER:-stampede}
# Extra options for the stack's own mariadbd (e.g. --innodb-flush-log-at-trx-commit=2), after
# the stack's own, so they win. Applies when MariaDB starts.
MYSQL_SERVER_ARGS=${MYSQL_SERVER_ARGS:-}
# The broker also listens on BROKER_PORT-2 (fast channel) and BROKER_PORT+1 (HA);
# its own health endpoint on BROKER_PORT+3.
BROKER_HEALTH_PORT=$((BROKER_PORT + 3))

ROCKETMQ_VERSION=1.0.0
# STACK_APT_PACKAGES replaces the list (scripts/check.sh adds one no machine has).
# gcc and libc6-dev: the workspace builds C (mimalloc, ring) through the `cc` crate.
APT_PACKAGES=${STACK_APT_PACKAGES:-redis-server mariadb-server mariadb-client nginx libnginx-mod-http-lua lua-resty-core lua-nginx-redis lua-cjson curl openssl python3 gcc libc6-dev}
# The Rust toolchain is the one thing the scripts do not install (rustup's, not Debian's
# older cargo): as new as the workspace's rust-version.
RUST_MIN=$(sed -n 's/^rust-version = "\(.*\)"$/\1/p' "$ROOT/Cargo.toml")
# cargo install keeps its build here, so a second install or upgrade reuses it.
ROCKETMQ_BUILD_DIR=${ROCKETMQ_BUILD_DIR:-$HOME/.cache/stampede/rocketmq-target}
CARGO_BIN=${CARGO_HOME:-$HOME/.cargo}/bin
# The core is built with this cargo profile (the tests use dev, like their own build).
CORE_PROFILE=${CORE_PROFILE:-release}
# The core's runtime threads (server.worker_threads). One: on a machine the core shares
# with nginx, Redis, MariaDB and the broker, a second thread mostly wakes the first
# (README "Measured": 15 % less core CPU per order, the same latency); 0 = one per CPU.
CORE_WORKER_THREADS=${CORE_WORKER_THREADS:-1}
case $CORE_WORKER_THREADS in
'' | *[!0-9]*) echo "stack: CORE_WORKER_THREADS must be a number (0 = one per CPU), not '$CORE_WORKER_THREADS'" >&2; exit 2 ;;
esac
# Where cargo puts what it builds: CARGO_TARGET_DIR if set (relative to the checkout, as
# cargo reads it from here), else the checkout's target/.
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
case $TARGET_DIR in /*) ;; *) TARGET_DIR=$ROOT/$TARGET_DIR ;; esac
CORE_BIN=$TARGET_DIR/$([ "$CORE_PROFILE" = dev ] && echo debug || echo "$CORE_PROFILE")/stampede
PAYSIM_BIN=$(dirname "$CORE_BIN")/stampede-paysim

PIDS=$STACK_DIR/pids
LOGS=$STACK_DIR/logs
case $STACK_MODE in
  single) ;;
  cluster) CORES=2 ;;
  *) printf 'stack: STACK_MODE must be single or cluster, not %s\n' "$STACK_MODE" >&2; exit 1 ;;
esac
case $CORES in
  1) ;;
  2) PARTS_DEFAULT="redis mysql namesrv broker core core2 paysim edge" ;;
  *) printf 'stack: CORES must be 1 or 2, not %s\n' "$CORES" >&2; exit 1 ;;
esac
[ "$STACK_MODE" = single ] || PARTS_DEFAULT="rediscluster mysql namesrv broker core core2 paysim edge edge2"
# Every part either mode may have started, in start order (`down` stops what runs).
PARTS_ALL="redis rediscluster mysql namesrv broker core core2 paysim edge edge2"
CLUSTER_PORTS=$(seq "$REDIS_CLUSTER_PORT" $((REDIS_CLUSTER_PORT + 5)) | paste -sd ' ')
# The nodes as the edge and the core name them.
cluster_nodes() { # cluster_nodes [SCHEME [SUFFIX]]: every node as SCHEME127.0.0.1:PORTSUFFIX, joined by ','
  local p out=""
  for p in $CLUSTER_PORTS; do out+="${out:+,}${1:-}127.0.0.1:$p${2:-}"; done
  printf '%s' "$out"
}
if [ "$STACK_MODE" = cluster ]; then
  REDIS_CLUSTER_NODES=$(cluster_nodes)
else
  REDIS_CLUSTER_NODES=""
fi

say() { printf '%s\n' "$*"; }
die() { printf 'stack: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------- helpers
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

pid_of() { cat "$PIDS/$1.pid" 2>/dev/null || true; } # no pid file: nothing

alive() { local pid; pid=$(pid_of "$1"); [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; }

any_alive() { # any part of this state dir running
  local f
  for f in "$PIDS"/*.pid; do
    [ -e "$f" ] || continue
    alive "$(basename "$f" .pid)" && return 0
  done
  return 1
}

# wait_for PART SECONDS: until PART's health check passes. A part this script started
# itself (its pid file holds the process, `$!`) that exits meanwhile will not come up:
# that ends the wait at once, with the log's last lines, instead of after all of it (a
# core refusing its configuration exits 64 at once; the wait was 90 s).
wait_for() {
  local part=$1 secs=$2 i log
  for ((i = 0; i < secs * 10; i++)); do
    if "health_$part" >/dev/null 2>&1; then return 0; fi
    case $part in
      namesrv | broker | core | core2 | paysim)
        if ! alive "$part"; then
          say "  $part: exited while starting" >&2
          log=$LOGS/$part.log
          [ -s "$log" ] && tail -n 5 "$log" | sed 's/^/    /' >&2
          return 1
        fi
        ;;
    esac
    sleep 0.1
  done
  return 1
}

# before_start PART PORT: 0 = start it, 1 = already answering (reuse), exit = port taken.
before_start() {
  local part=$1 port=$2
  if "health_$part" >/dev/null 2>&1; then
    say "  $part: already running on 127.0.0.1:$port"
    return 1
  fi
  if port_open "$port"; then
    die "port $port is taken by something that is not the expected $part; free it or set ${3:-its port variable}"
  fi
  return 0
}

secret_file() { # secret_file NAME: generated once, then reused.
  local f=$STACK_DIR/$1
  [ -s "$f" ] || (umask 077 && openssl rand -hex 24 >"$f")
  printf '%s' "$f"
}

# ---------------------------------------------------------------- the parts
# One file per kind of part, each defining its health_<part> and start_<part>.
# shellcheck source=scripts/stack/install.sh
. "$ROOT/scripts/stack/install.sh"
# shellcheck source=scripts/stack/redis.sh
. "$ROOT/scripts/stack/redis.sh"
# shellcheck source=scripts/stack/mysql.sh
. "$ROOT/scripts/stack/mysql.sh"
# shellcheck source=scripts/stack/edge.sh
. "$ROOT/scripts/stack/edge.sh"

# ---------------------------------------------------------------- rocketmq
health_namesrv() { port_open "$NAMESRV_PORT" && alive_or_foreign namesrv; }
# A port that answers without our pid file is someone else's name server: reuse it.
alive_or_foreign() { alive "$1" || [ ! -f "$PIDS/$1.pid" ]; }
start_namesrv() {
  before_start namesrv "$NAMESRV_PORT" NAMESRV_PORT || return 0
  mkdir -p "$STACK_DIR/rocketmq"
  ROCKETMQ_HOME=$STACK_DIR/rocketmq nohup "$CARGO_BIN/rocketmq-namesrv-rust" \
    --bindAddress 127.0.0.1 --listenPort "$NAMESRV_PORT" --rocketmqHome "$STACK_DIR/rocketmq" \
    --log-filter warn >"$LOGS/namesrv.log" 2>&1 &
  echo $! >"$PIDS/namesrv.pid"
  wait_for namesrv 20 || die "the name server did not come up; see $LOGS/namesrv.log"
  say "  namesrv: started on 127.0.0.1:$NAMESRV_PORT"
}

health_broker() { curl -fsS -m 1 "http://127.0.0.1:$BROKER_HEALTH_PORT/readyz" >/dev/null 2>&1; }
start_broker() {
  before_start broker "$BROKER_PORT" BROKER_PORT || return 0
  local dir=$STACK_DIR/rocketmq
  mkdir -p "$dir/store"
  sed -e "s#@NAMESRV@#127.0.0.1:$NAMESRV_PORT#g" -e "s#@PORT@#$BROKER_PORT#g" \
    -e "s#@HA_PORT@#$((BROKER_PORT + 1))#g" -e "s#@STORE@#$dir/store#g" \
    "$ROOT/scripts/broker.toml.in" >"$dir/broker.toml"
  ROCKETMQ_HOME=$dir ROCKETMQ_SECURITY_PROFILE=development-insecure-loopback \
    ROCKETMQ_HEALTH_BIND_ADDR=127.0.0.1:$BROKER_HEALTH_PORT nohup "$CARGO_BIN/rocketmq-broker-rust" \
    -c "$dir/broker.toml" -n "127.0.0.1:$NAMESRV_PORT" --log-filter warn >"$LOGS/broker.log" 2>&1 &
  echo $! >"$PIDS/broker.pid"
  wait_for broker 60 || die "the broker did not come up; see $LOGS/broker.log"
  say "  broker: started on 127.0.0.1:$BROKER_PORT"
}

# ---------------------------------------------------------------- core
core_env() { # core_env [PUBLIC_PORT ADMIN_PORT]: the settings of a core (the first's by default)
  export STAMPEDE_SERVER__PUBLIC_ADDR=127.0.0.1:${1:-$CORE_PORT}
  export STAMPEDE_SERVER__ADMIN_ADDR=127.0.0.1:${2:-$ADMIN_PORT}
  export STAMPEDE_SERVER__WORKER_THREADS=$CORE_WORKER_THREADS
  export STAMPEDE_REDIS__URL=redis://127.0.0.1:$REDIS_PORT/
  if [ "$STACK_MODE" = cluster ]; then
    export STAMPEDE_REDIS__MODE=cluster
    # A 202 once the admission's master has passed it to its replica (redis.wait_replicas;
    # REDIS_WAIT_REPLICAS=0 answers on the master's word, to measure what it costs).
    export STAMPEDE_REDIS__WAIT_REPLICAS=${REDIS_WAIT_REPLICAS:-1}
    STAMPEDE_REDIS__NODES=$(cluster_nodes redis:// /)
    export STAMPEDE_REDIS__NODES
  fi
  export STAMPEDE_MYSQL__URL=mysql://$MYSQL_USER@127.0.0.1:$MYSQL_PORT/$MYSQL_DATABASE
  export STAMPEDE_MYSQL__PASSWORD_FILE=$STACK_DIR/mysql.password
  export STAMPEDE_ROCKETMQ__NAMESRV_ADDR=127.0.0.1:$NAMESRV_PORT
  export STAMPEDE_AUTH__ADMIN_TOKEN_FILE=$STACK_DIR/admin.token
  export STAMPEDE_AUTH__TOKEN_SECRET_FILE=$STACK_DIR/token.secret
  export STAMPEDE_PAYMENTS__PROVIDER_SECRET_FILE=$STACK_DIR/provider.secret
  export STAMPEDE_PAYMENTS__PROVIDER_PAGE_URL=http://127.0.0.1:$PAYSIM_PORT/paysim/pay
}
health_core() { curl -fsS -m 1 "http://127.0.0.1:$ADMIN_PORT/healthz" >/dev/null 2>&1; }
health_core2() { curl -fsS -m 1 "http://127.0.0.1:$ADMIN2_PORT/healthz" >/dev/null 2>&1; }
start_core() { start_a_core core "$CORE_PORT" "$ADMIN_PORT" CORE_PORT ADMIN_PORT; }
start_core2() { start_a_core core2 "$CORE2_PORT" "$ADMIN2_PORT" CORE2_PORT ADMIN2_PORT; }
# start_a_core PART PUBLIC_PORT ADMIN_PORT (and the names of their variables)
start_a_core() {
  local part=$1 public=$2 admin=$3
  secret_file admin.token >/dev/null
  secret_file token.secret >/dev/null
  secret_file provider.secret >/dev/null
  before_start "$part" "$admin" "$5" || return 0
  port_open "$public" && die "port $public is taken by something that is not the Stampede core; free it or set $4"
  build_core
  (
    core_env "$public" "$admin"
    nohup "$CORE_BIN" serve >>"$LOGS/$part.log" 2>&1 &
    echo $! >"$PIDS/$part.pid"
  )
  wait_for "$part" 90 || die "the core did not come up; see $LOGS/$part.log"
  say "  $part: started, public 127.0.0.1:$public, admin 127.0.0.1:$admin"
}

# ---------------------------------------------------------------- paysim
# The payment provider, simulated (stampede-paysim): a tool of its own on a loopback
# port, never behind the edge — it signs a payment for any order it is asked to.
health_paysim() { [ "$(curl -fsS -m 1 "http://127.0.0.1:$PAYSIM_PORT/paysim/health" 2>/dev/null)" = ok ]; }
start_paysim() {
  secret_file provider.secret >/dev/null
  before_start paysim "$PAYSIM_PORT" PAYSIM_PORT || return 0
  (cd "$ROOT" && cargo build --profile "$CORE_PROFILE" --quiet -p stampede-paysim)
  nohup "$PAYSIM_BIN" serve --listen "127.0.0.1:$PAYSIM_PORT" \
    --secret-file "$STACK_DIR/provider.secret" --app-origin "http://127.0.0.1:$EDGE_PORT" \
    --callback-url "http://127.0.0.1:$EDGE_PORT/api/payments/callback" >>"$LOGS/paysim.log" 2>&1 &
  echo $! >"$PIDS/paysim.pid"
  wait_for paysim 20 || die "the payment simulator did not come up; see $LOGS/paysim.log"
  say "  paysim: started on 127.0.0.1:$PAYSIM_PORT (the provider's page, /paysim/pay; loopback only)"
}

# ---------------------------------------------------------------- secrets
# A new token secret, the previous one still accepted: the core re-reads the keyring
# within a second, the edge on a graceful reload; nobody is logged out.
rotate_token_secret() {
  build_core
  (core_env && "$CORE_BIN" rotate-token-secret)
  if alive edge; then
    start_edge # the keyring changed: a graceful reload
  fi
  if alive edge2; then
    start_edge2
  fi
}

# ---------------------------------------------------------------- stop, status
stop_part() {
  local part=$1 pid p
  if [ "$part" = rediscluster ]; then
    # Every node this state dir started, whatever REDIS_CLUSTER_PORT says now.
    for p in "$PIDS"/rediscluster-*.pid; do
      [ -e "$p" ] && stop_part "$(basename "$p" .pid)"
    done
    return 0
  fi
  pid=$(pid_of "$part")
  [ -n "$pid" ] || return 0
  if kill -0 "$pid" 2>/dev/null; then
    # nginx stops gracefully on QUIT; everything else on TERM.
    case $part in edge | edge2) kill -QUIT "$pid" ;; *) kill -TERM "$pid" ;; esac
    local i
    for ((i = 0; i < 300; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
      say "  $part: did not stop within 30 s; killing"
      kill -KILL "$pid" 2>/dev/null || true
    fi
    say "  $part: stopped"
  fi
  rm -f "$PIDS/$part.pid"
}

port_of() {
  case $1 in
    redis) echo "$REDIS_PORT" ;; mysql) echo "$MYSQL_PORT" ;; namesrv) echo "$NAMESRV_PORT" ;;
    broker) echo "$BROKER_PORT" ;; core) echo "$CORE_PORT,$ADMIN_PORT" ;; paysim) echo "$PAYSIM_PORT" ;;
    core2) echo "$CORE2_PORT,$ADMIN2_PORT" ;;
    edge) echo "$EDGE_PORT,$OPS_PORT" ;;
    edge2) echo "$EDGE2_PORT,$OPS2_PORT" ;;
    rediscluster) echo "$REDIS_CLUSTER_PORT-$((REDIS_CLUSTER_PORT + 5))" ;;
  esac
}

status() {
  local down=0 part pid health
  printf '%-13s %-12s %-8s %s\n' PART PORT PID HEALTH
  for part in $PARTS_DEFAULT; do
    pid=$(pid_of "$part")
    [ "$part" = rediscluster ] && pid=$(pid_of "rediscluster-$REDIS_CLUSTER_PORT")
    if "health_$part" >/dev/null 2>&1; then
      health=up
      [ -n "$pid" ] || health="up (not started by this stack)"
    elif [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then
      health="DOWN (pid $pid is gone)"; down=1
    elif [ -n "$pid" ]; then
      health="DOWN (running, not answering)"; down=1
    else
      health="down (not started)"; down=1
    fi
    printf '%-13s %-12s %-8s %s\n' "$part" "$(port_of "$part")" "${pid:--}" "$health"
  done
  if health_core; then
    say ""
    say "core readiness: $(curl -sS -m 3 "http://127.0.0.1:$ADMIN_PORT/readyz" 2>/dev/null)"
  fi
  return $down
}

# ---------------------------------------------------------------- main
cmd=${1:-status}
shift || true
parts=${*:-$PARTS_DEFAULT}
case $cmd in
  install)
    case ${1:-} in
      "" | --dry-run) install "${1:-}" ;;
      *) die "unknown option $1 to install (only --dry-run)" ;;
    esac
    ;;
  install-bench-tools)
    case ${1:-} in
      "" | --dry-run) install_bench_tools "${1:-}" ;;
      *) die "unknown option $1 to install-bench-tools (only --dry-run)" ;;
    esac
    ;;
  up)
    # A stack is one mode: cores on a cluster and edges on a single Redis see nothing
    # of each other's sales.
    running=$(cat "$MODE_FILE" 2>/dev/null || true)
    if [ -n "$running" ] && [ "$running" != "$STACK_MODE" ] && any_alive; then
      die "the stack in $STACK_DIR runs in STACK_MODE=$running; stop it first (make down), or use STACK_MODE=$running"
    fi
    install
    mkdir -p "$PIDS" "$LOGS"
    printf '%s\n' "$STACK_MODE" >"$MODE_FILE"
    # (A cluster always runs two: not remembered as a choice of the single stack's.)
    if [ "$STACK_MODE" = single ]; then printf '%s\n' "$CORES" >"$CORES_FILE"; fi
    say "starting the stack (state in $STACK_DIR)"
    for part in $parts; do
      step="start $part"
      "start_$part"
    done
    ;;
  down)
    say "stopping the stack (state in $STACK_DIR)"
    # Everything either mode started stops, whatever CORES and STACK_MODE are now.
    [ -n "$*" ] || parts=$PARTS_ALL
    for part in $(tr -s ' ' '\n' <<<"$parts" | tac); do
      step="stop $part"
      stop_part "$part"
    done
    [ -n "$*" ] || rm -f "$MODE_FILE" "$CORES_FILE"
    ;;
  status)
    # A part down is an answer, not a failure of this script: exit 1 without the
    # error trap's "failed while" line.
    if ! status; then exit 1; fi
    ;;
  rotate-token-secret)
    step="rotate the token secret"
    rotate_token_secret
    ;;
  env) core_env && env | grep '^STAMPEDE_' ;;
  *) die "unknown command $cmd (install, install-bench-tools, up, down, status, rotate-token-secret, env)" ;;
esac
