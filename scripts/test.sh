#!/usr/bin/env bash
# `make test`: the fresh-machine checks (scripts/check.sh), rustfmt and clippy present,
# formatting, lints, unit tests; then, on a disposable stack of its own (.stack-test/,
# ports below; it never touches a running demo): the stores started as an unprivileged
# user, a foreign Redis refused without its AOF, the end-to-end tests, chaos (short), the
# browser tests and the API fuzz; last a short run on the cluster stack
# (scripts/test-cluster.sh --short). Each stack is stopped and removed on the way out,
# pass or fail.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

export STACK_DIR=$ROOT/.stack-test
export EDGE_PORT=18080 CORE_PORT=18081 ADMIN_PORT=19091 REDIS_PORT=16379 MYSQL_PORT=13306
export NAMESRV_PORT=19876 BROKER_PORT=20911 OPS_PORT=18082 PAYSIM_PORT=18092 CORE_PROFILE=dev

step() { printf '\n==> %s\n' "$*"; }

step "fresh-machine checks: shellcheck, install --dry-run, docker-compose.yml (scripts/check.sh)"
scripts/check.sh
step "the toolchain's rustfmt and clippy (scripts/rust-components.sh)"
scripts/rust-components.sh
step "cargo fmt --check"
cargo fmt --all -- --check
step "cargo clippy (warnings denied)"
cargo clippy --workspace --all-targets --quiet -- -D warnings
step "unit tests"
cargo test --workspace --lib --bins --quiet

step "test stack (state in $STACK_DIR)"
teardown() {
  scripts/stack.sh down >/dev/null 2>&1 || true
  rm -rf "$STACK_DIR"
}
teardown # whatever an interrupted run left behind
# The cluster test stack shares these ports (scripts/test-cluster.sh).
STACK_DIR=$ROOT/.stack-cluster-test STACK_MODE=cluster scripts/stack.sh down >/dev/null 2>&1 || true
trap teardown EXIT
scripts/stack.sh up

# After the test stack's `up`, which installed what a fresh machine lacked (as root).
step "the stack's stores start as a user that is not root (scripts/check-unprivileged.sh)"
scripts/check-unprivileged.sh
step "a Redis the stack did not start is used only with its AOF on (scripts/check-foreign-redis.sh)"
scripts/check-foreign-redis.sh

step "end-to-end tests"
cargo build --quiet -p stampede-bench # run by the bench test
# cluster:: needs the cluster stack: scripts/test-cluster.sh runs it, below.
if ! cargo test -p stampede-e2e --test e2e -- --test-threads 2 --skip cluster::; then
  # What the stack saw, before teardown removes it.
  for log in "$STACK_DIR/nginx/logs/error.log" "$STACK_DIR/logs/core.log"; do
    printf '\n==> last lines of %s\n' "$log"
    tail -n 40 "$log" 2>/dev/null | sed 's/\x1b\[[0-9;]*m//g' | cut -c1-400
  done
  exit 1
fi

step "chaos, short: a sale each with Redis killed, Redis hung, the core killed three times, one of two cores killed, payments racing their timeout (scripts/chaos.sh --short)"
BENCH=${CARGO_TARGET_DIR:-target}/debug/stampede-bench
case $BENCH in /*) ;; *) BENCH=$ROOT/$BENCH ;; esac
BENCH=$BENCH scripts/chaos.sh --short

step "browser tests (Playwright, Debian's Chromium)"
scripts/ui-deps.sh
export SCREENSHOT_DIR=$ROOT/target/ui-screenshots
if ! node --test --test-concurrency=1 ui-tests/; then
  for log in "$STACK_DIR/nginx/logs/error.log" "$STACK_DIR/logs/core.log" "$STACK_DIR/logs/paysim.log"; do
    printf '\n==> last lines of %s\n' "$log"
    tail -n 40 "$log" 2>/dev/null | sed 's/\x1b\[[0-9;]*m//g' | cut -c1-400
  done
  exit 1
fi
echo "screenshots: $SCREENSHOT_DIR"

# Last: it closes and reopens events, creates users and changes the edge's limits for its
# run, which the tests above must not see.
step "API fuzz: schemathesis against docs/openapi.yaml, public (edge) and admin (scripts/fuzz-api.sh)"
scripts/fuzz-api.sh

# The single stack down first: the cluster stack uses the same ports.
teardown
step "cluster stack, short: purchases, a Redis master killed mid-sale, one of two cores killed, two edges (scripts/test-cluster.sh --short)"
scripts/test-cluster.sh --short
