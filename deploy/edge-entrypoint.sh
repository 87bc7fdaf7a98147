#!/bin/sh
# Renders openresty/conf/ for the OpenResty image, as scripts/stack.sh does for Debian's
# nginx: the same ${...} values, the module lines dropped (Lua is built in), the core,
# and Redis at their compose hosts (cosockets take an address, so Redis is resolved here),
# and OpenResty's name for the Redis client.
set -eu
mkdir -p /run/stampede/conf /run/stampede/logs /run/stampede/temp /run/stampede/lua/stampede
redis_ip=$(getent hosts "$REDIS_HOST" | awk '{print $1; exit}')
for f in /stampede/openresty/conf/*; do
  sed -e "s#\${EDGE_PORT}#${EDGE_PORT}#g" -e "s#\${CORE_PORT}#${CORE_PORT}#g" \
      -e "s#\${REDIS_PORT}#${REDIS_PORT}#g" -e "s#\${ADMIN_PORT}#${ADMIN_PORT}#g" \
      -e "s#\${OPS_PORT}#${OPS_PORT}#g" -e "s#\${TOKEN_SECRET_FILE}##g" \
      -e "s#\${REDIS_CLUSTER_NODES}#${REDIS_CLUSTER_NODES:-}#g" \
      -e "s#127.0.0.1:${CORE_PORT}#${CORE_HOST}:${CORE_PORT}#g" \
      -e "s#127.0.0.1:${ADMIN_PORT}#${CORE_HOST}:${ADMIN_PORT}#g" \
      -e "s#host = \"127.0.0.1\"#host = \"${redis_ip}\"#" \
      -e "s#listen 127.0.0.1:#listen 0.0.0.0:#g" \
      -e "s#\${STAMPEDE_ROOT}/lua/edge#/run/stampede/lua#g" \
      -e "s#\${STAMPEDE_ROOT}#/stampede#g" \
      -e '/^load_module/d' \
      -e 's#/etc/nginx/mime.types#/usr/local/openresty/nginx/conf/mime.types#' \
      "$f" > "/run/stampede/conf/$(basename "$f")"
done
for f in /stampede/lua/edge/stampede/*.lua; do
  sed -e 's#require "nginx.redis"#require "resty.redis"#' "$f" > "/run/stampede/lua/stampede/$(basename "$f")"
done
exec openresty -p /run/stampede/ -c conf/nginx.conf -g 'daemon off;'
