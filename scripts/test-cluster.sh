#!/usr/bin/env bash
# `make test-cluster`: the end-to-end tests against the cluster stack (STACK_MODE=cluster:
# a Redis Cluster of three masters with a replica each, two cores, two edges; MariaDB,
# the RocketMQ name server and broker as in the single stack), in a disposable state
# directory of its own (.stack-cluster-test/), stopped and removed on the way out.
#
#   scripts/test-cluster.sh           the purchase, buckets, pipeline, lifecycle and reconcile tests,
#                                     then the cluster's own (a master killed mid-sale, one
#                                     of two cores killed mid-sale, two edges agreeing),
#                                     then the browser tests spread over both edges
#   scripts/test-cluster.sh --short   the cluster's own tests, the purchase and buckets tests
#                                     (`make test` runs this)
#
# It uses the test stack's ports (plus 17001-17006 for the cluster and 18084/18086 for
# the second edge), so it runs after `make test`'s own stack is down, never beside it.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

short=0
case ${1:-} in
  --short) short=1 ;;
  "") ;;
  *) echo "test-cluster: unknown option $1 (only --short)" >&2; exit 2 ;;
esac

export STACK_MODE=cluster STACK_DIR=$ROOT/.stack-cluster-test
export EDGE_PORT=18080 CORE_PORT=18081 ADMIN_PORT=19091 REDIS_PORT=16379 MYSQL_PORT=13306
export NAMESRV_PORT=19876 BROKER_PORT=20911 OPS_PORT=18082 PAYSIM_PORT=18092 CORE_PROFILE=dev
export REDIS_CLUSTER_PORT=17001 EDGE2_PORT=18084 OPS2_PORT=18086

step() { printf '\n==> %s\n' "$*"; }

step "cluster stack (state in $STACK_DIR)"
teardown() {
  scripts/stack.sh down >/dev/null 2>&1 || true
  rm -rf "$STACK_DIR"
}
teardown # whatever an interrupted run left behind
# make test's single stack shares these ports: a core of it still answering would be
# taken for this stack's own.
STACK_DIR=$ROOT/.stack-test STACK_MODE=single scripts/stack.sh down >/dev/null 2>&1 || true
trap teardown EXIT
scripts/stack.sh up
cargo build --quiet -p stampede-bench # run by cluster::bench

show_logs() {
  local log
  for log in "$STACK_DIR/nginx/logs/error.log" "$STACK_DIR/nginx2/logs/error.log" \
    "$STACK_DIR/logs/core.log" "$STACK_DIR/logs/core2.log"; do
    printf '\n==> last lines of %s\n' "$log"
    tail -n 30 "$log" 2>/dev/null | sed 's/\x1b\[[0-9;]*m//g' | cut -c1-400
  done
  printf '\n==> the cluster as 127.0.0.1:%s sees it\n' "$REDIS_CLUSTER_PORT"
  redis-cli -p "$REDIS_CLUSTER_PORT" cluster nodes 2>&1 | cut -d' ' -f2-3,8- || true
}
e2e() { cargo test -p stampede-e2e --test e2e -- "$@" || { show_logs; exit 1; }; }

if [ $short = 1 ]; then
  step "end-to-end on the cluster: purchase, buckets"
  e2e --test-threads 2 purchase:: buckets:: --skip cluster::
else
  step "end-to-end on the cluster: purchase, buckets, pipeline, lifecycle, reconcile"
  e2e --test-threads 2 purchase:: buckets:: pipeline:: lifecycle:: reconcile:: --skip cluster::
fi

# One at a time: the master kill fails a shard over under the other tests' feet.
step "the cluster's own: a master killed mid-sale, one of two cores killed, two edges"
e2e --test-threads 1 cluster::

if [ $short = 0 ]; then
  step "browser tests, the second buyer and half the dashboard's buyers on the second edge"
  scripts/ui-deps.sh
  SCREENSHOT_DIR=$ROOT/target/ui-screenshots-cluster node --test --test-concurrency=1 ui-tests/ \
    || { show_logs; exit 1; }
fi
