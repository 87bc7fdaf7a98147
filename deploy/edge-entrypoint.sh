#!/bin/sh
# Renders openresty/conf/nginx.conf for the OpenResty image, as scripts/stack.sh does for
# Debian's nginx: the same ${...} values, and the module lines dropped (Lua is built in).
set -eu
mkdir -p /run/stampede/conf /run/stampede/logs /run/stampede/temp
sed -e "s#\${EDGE_PORT}#${EDGE_PORT}#g" -e "s#\${CORE_PORT}#${CORE_PORT}#g" \
    -e "s#127.0.0.1:${CORE_PORT}#${CORE_HOST}:${CORE_PORT}#g" \
    -e "s#listen 127.0.0.1:#listen 0.0.0.0:#g" \
    -e "s#\${STAMPEDE_ROOT}#/stampede#g" \
    -e '/^load_module/d' \
    -e 's#/etc/nginx/mime.types#/usr/local/openresty/nginx/conf/mime.types#' \
    /stampede/openresty/conf/nginx.conf > /run/stampede/conf/nginx.conf
exec openresty -p /run/stampede/ -c conf/nginx.conf -g 'daemon off;'
