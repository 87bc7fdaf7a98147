# shellcheck shell=bash
# Sourced by scripts/stack.sh (its settings and helpers are in scope). Redis: one server (part redis), or a Redis Cluster of six (part rediscluster).

# ---------------------------------------------------------------- redis
# What every Redis of the stack runs with, the single server and each cluster node, in
# REDIS_COMMON: the AOF, fsynced as REDIS_APPENDFSYNC says; no RDB snapshots; stream nodes
# of 16 entries, not 100 — settle.lua deletes each settled reservation from its event's
# stream, and XDEL walks the entry's node from its start: 4.7 µs an entry with 100 a
# node, 1.4 with 16, XADD and XREADGROUP unchanged, the backlog's memory +33 % (README
# "Measured").
redis_common_args() {
  case $REDIS_APPENDFSYNC in
    always | everysec) ;;
    *) die "REDIS_APPENDFSYNC must be always or everysec, not $REDIS_APPENDFSYNC" ;;
  esac
  REDIS_COMMON=(--appendonly yes --appendfsync "$REDIS_APPENDFSYNC" --save "" --stream-node-max-entries 16)
}
health_redis() { [ "$(redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping 2>/dev/null)" = PONG ]; }
# A Redis answering on PORT that this state dir did not start (pid file PART): the
# distro's service, another state dir's. Used only when it keeps the AOF, as the stack's
# own does: without it an admitted purchase (202) survives no restart of that Redis.
# `make down` leaves it running, and the chaos suite cannot kill it.
foreign_redis() { # PORT PART PORT_VARIABLE
  local aof
  alive "$2" && return 0
  aof=$(redis-cli -h 127.0.0.1 -p "$1" config get appendonly 2>/dev/null | sed -n 2p)
  [ "$aof" = yes ] ||
    die "a Redis this stack did not start answers on 127.0.0.1:$1 with appendonly ${aof:-unreadable}: a 202 would not survive its restart (Debian's service? systemctl disable --now redis-server). Stop it, or set $3 to a free port"
  say "  $2: using a Redis this stack did not start on 127.0.0.1:$1 (appendonly yes); make down leaves it running"
}
start_redis() {
  if health_redis; then foreign_redis "$REDIS_PORT" redis REDIS_PORT; fi
  before_start redis "$REDIS_PORT" REDIS_PORT || return 0
  redis_common_args
  mkdir -p "$STACK_DIR/redis"
  redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --dir "$STACK_DIR/redis" "${REDIS_COMMON[@]}" \
    --daemonize yes --pidfile "$PIDS/redis.pid" --logfile "$LOGS/redis.log"
  wait_for redis 20 || die "Redis did not come up; see $LOGS/redis.log"
  say "  redis: started on 127.0.0.1:$REDIS_PORT"
}

# ---------------------------------------------------------------- redis cluster
cluster_cli() { redis-cli -h 127.0.0.1 -p "$REDIS_CLUSTER_PORT" "$@" 2>/dev/null; }
node_up() { [ "$(redis-cli -h 127.0.0.1 -p "$1" ping 2>/dev/null)" = PONG ]; }
# Up: every node answers and the cluster's state is ok (every slot served).
health_rediscluster() {
  local p
  for p in $CLUSTER_PORTS; do node_up "$p" || return 1; done
  cluster_cli cluster info | grep -q '^cluster_state:ok'
}
start_rediscluster() {
  local p dir i
  for p in $CLUSTER_PORTS; do
    if node_up "$p"; then foreign_redis "$p" "rediscluster-$p" REDIS_CLUSTER_PORT; fi
  done
  if health_rediscluster; then
    say "  rediscluster: already running on 127.0.0.1:${CLUSTER_PORTS// /,}"
    return 0
  fi
  redis_common_args
  for p in $CLUSTER_PORTS; do
    node_up "$p" && continue
    port_open "$p" && die "port $p is taken by something that is not a node of the stack's Redis Cluster; free it or set REDIS_CLUSTER_PORT"
    dir=$STACK_DIR/redis-cluster/$p
    mkdir -p "$dir"
    redis-server --bind 127.0.0.1 --port "$p" --dir "$dir" \
      --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 2000 \
      "${REDIS_COMMON[@]}" \
      --daemonize yes --pidfile "$PIDS/rediscluster-$p.pid" --logfile "$LOGS/rediscluster-$p.log"
  done
  for p in $CLUSTER_PORTS; do
    for ((i = 0; i < 200; i++)); do node_up "$p" && break; sleep 0.1; done
    node_up "$p" || die "Redis Cluster node $p did not come up; see $LOGS/rediscluster-$p.log"
  done
  # Created once; afterwards every node finds the others through its nodes.conf.
  if [ "$(cluster_cli cluster info | sed -n 's/^cluster_known_nodes:\([0-9]*\).*/\1/p')" = 1 ]; then
    say "  rediscluster: creating the cluster (3 masters, a replica each)"
    # shellcheck disable=SC2046 # one argument per node
    redis-cli --cluster create $(for p in $CLUSTER_PORTS; do printf '127.0.0.1:%s ' "$p"; done) \
      --cluster-replicas 1 --cluster-yes >>"$LOGS/rediscluster-create.log" 2>&1 \
      || die "redis-cli --cluster create failed; see $LOGS/rediscluster-create.log"
  fi
  wait_for rediscluster 60 || die "the Redis Cluster did not reach state ok; see $LOGS/rediscluster-*.log"
  say "  rediscluster: started on 127.0.0.1:${CLUSTER_PORTS// /,} (masters and replicas: redis-cli -p $REDIS_CLUSTER_PORT cluster nodes)"
}
