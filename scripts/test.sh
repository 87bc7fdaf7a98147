#!/usr/bin/env bash
# `make test`: formatting, lints, unit tests, then the end-to-end tests against a
# disposable stack of their own (.stack-test/, ports below), which never touches a
# running demo. The test stack is stopped and removed on the way out, pass or fail.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

export STACK_DIR=$ROOT/.stack-test
export EDGE_PORT=18080 CORE_PORT=18081 ADMIN_PORT=19091 REDIS_PORT=16379 MYSQL_PORT=13306
export NAMESRV_PORT=19876 BROKER_PORT=20911 CORE_PROFILE=dev

step() { printf '\n==> %s\n' "$*"; }

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
trap teardown EXIT
scripts/stack.sh up

step "end-to-end tests"
cargo build --quiet -p stampede-bench # run by the bench test
if ! cargo test -p stampede-e2e --test e2e -- --test-threads 2; then
  # What the stack saw, before teardown removes it.
  for log in "$STACK_DIR/nginx/logs/error.log" "$STACK_DIR/logs/core.log"; do
    printf '\n==> last lines of %s\n' "$log"
    tail -n 40 "$log" 2>/dev/null | sed 's/\x1b\[[0-9;]*m//g' | cut -c1-400
  done
  exit 1
fi
