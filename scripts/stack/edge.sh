# shellcheck shell=bash
# Sourced by scripts/stack.sh (its settings and helpers are in scope). The nginx + Lua edges: openresty/conf rendered per edge, started or reloaded.

# ---------------------------------------------------------------- edge
health_edge() { [ "$(curl -fsS -m 1 "http://127.0.0.1:$EDGE_PORT/edge/health" 2>/dev/null)" = ok ]; }
health_edge2() { [ "$(curl -fsS -m 1 "http://127.0.0.1:$EDGE2_PORT/edge/health" 2>/dev/null)" = ok ]; }
EDGE_PREFIX=$STACK_DIR/nginx
render_edge_conf() { # render_edge_conf DIR EDGE_PORT OPS_PORT: openresty/conf/, filled in → DIR
  mkdir -p "$1"
  local f core2=""
  [ "$CORES" = 1 ] || core2="s|# \${CORE2_SERVER}.*|server 127.0.0.1:$CORE2_PORT;|"
  for f in "$ROOT"/openresty/conf/*; do
    sed -e "s#\${EDGE_PORT}#$2#g" -e "s#\${CORE_PORT}#$CORE_PORT#g" \
      -e "s#\${REDIS_PORT}#$REDIS_PORT#g" -e "s#\${STAMPEDE_ROOT}#$ROOT#g" \
      -e "s#\${ADMIN_PORT}#$ADMIN_PORT#g" -e "s#\${OPS_PORT}#$3#g" \
      -e "s#\${TOKEN_SECRET_FILE}#$STACK_DIR/token.secret#g" \
      -e "s#\${REDIS_CLUSTER_NODES}#$REDIS_CLUSTER_NODES#g" \
      -e "$core2" \
      "$f" >"$1/$(basename "$f")"
  done
  # Not read by nginx: makes an edited Lua module, or a rotated token secret, count
  # as a changed conf (a reload).
  cat "$ROOT"/lua/edge/stampede/*.lua "$STACK_DIR/token.secret" | sha256sum >"$1/lua.sha256"
}
# reload_edge MASTER_PID: a graceful reload, done once no worker of the old configuration
# accepts connections any more (each is "shutting down" or gone), so what follows — a
# request with a token of a rotated key — meets the new one. Fails when after 10 s they
# still do: nginx refused the new configuration.
reload_edge() {
  local master=$1 old p i serving
  old=$(pgrep -P "$master" -f 'worker process$' || true)
  kill -HUP "$master"
  for ((i = 0; i < 100; i++)); do
    serving=0
    for p in $old; do
      if { tr '\0' ' ' <"/proc/$p/cmdline"; } 2>/dev/null | grep -q 'worker process *$'; then serving=1; fi
    done
    [ "$serving" = 0 ] && return 0
    sleep 0.1
  done
  # nginx -t does not run init_by_lua: a Lua error there fails only the reload itself,
  # and the master keeps the old workers.
  return 1
}
# Started as root, nginx's workers run as nobody and read the app, the dashboard and the
# Lua from the checkout: one under a private directory (/root is 0700 on Debian) would
# answer 404 for the app while /edge/health passes. Said now, with the way out.
workers_can_read() {
  [ "$(id -u)" = 0 ] && command -v runuser >/dev/null 2>&1 || return 0
  local f
  for f in openresty/html/index.html openresty/ops/index.html lua/edge/stampede/access.lua; do
    runuser -u nobody -- test -r "$ROOT/$f" ||
      die "nginx's workers (user nobody) cannot read $ROOT/$f: a directory above it is private to its owner. Put the checkout where others may read it (e.g. /opt or /srv), or give the directories above it o+x"
  done
}
start_edge() { start_an_edge edge "$EDGE_PREFIX" "$EDGE_PORT" "$OPS_PORT" EDGE_PORT; }
start_edge2() { start_an_edge edge2 "$STACK_DIR/nginx2" "$EDGE2_PORT" "$OPS2_PORT" EDGE2_PORT; }
# start_an_edge PART PREFIX EDGE_PORT OPS_PORT (and the name of the port's variable)
start_an_edge() {
  local part=$1 prefix=$2 port=$3 ops=$4
  if alive "$part" && "health_$part"; then
    # Running: pick up an edited openresty/conf with a graceful reload, else leave it be.
    rm -rf "$prefix/conf.new"
    render_edge_conf "$prefix/conf.new" "$port" "$ops"
    if diff -rq "$prefix/conf.new" "$prefix/conf" >/dev/null; then
      rm -rf "$prefix/conf.new"
      say "  $part: already running on 127.0.0.1:$port"
    else
      nginx -p "$prefix/" -c conf.new/nginx.conf -t -q \
        || die "nginx rejected openresty/conf/nginx.conf"
      rm -rf "$prefix/conf.old" && mv "$prefix/conf" "$prefix/conf.old"
      mv "$prefix/conf.new" "$prefix/conf" && rm -rf "$prefix/conf.old"
      if ! reload_edge "$(pid_of "$part")"; then
        rm -f "$prefix/conf/lua.sha256" # so that the next start tries the reload again
        die "$part: nginx kept its old configuration (still serving it after 10 s): see $prefix/logs/error.log"
      fi
      say "  $part: openresty/conf or lua/edge changed; reloaded"
    fi
    return 0
  fi
  before_start "$part" "$port" "$5" || return 0
  workers_can_read
  secret_file token.secret >/dev/null
  mkdir -p "$prefix/logs" "$prefix/temp"
  chmod 0777 "$prefix/temp" # workers run as nobody and buffer request bodies here
  rm -rf "$prefix/conf"
  render_edge_conf "$prefix/conf" "$port" "$ops"
  nginx -p "$prefix/" -c conf/nginx.conf -t -q || die "nginx rejected openresty/conf/nginx.conf"
  nginx -p "$prefix/" -c conf/nginx.conf
  wait_for "$part" 20 || die "the edge did not come up; see $prefix/logs/error.log"
  cp "$prefix/logs/nginx.pid" "$PIDS/$part.pid"
  say "  $part: started on 127.0.0.1:$port (ops dashboard on 127.0.0.1:$ops)"
}
