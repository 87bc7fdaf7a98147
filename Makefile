# Stampede: the two commands are `make demo` and `make test` (see README.md).
.PHONY: up down status demo test test-cluster check bench bench-tools soak chaos install test-stack-up test-stack-down

# Where cargo puts what it builds (CARGO_TARGET_DIR, as cargo reads it here).
TARGET_DIR := $(or $(CARGO_TARGET_DIR),target)

# Install what is missing, start the whole local stack (idempotent).
up:
	scripts/stack.sh up

# Stop exactly what `make up` started.
down:
	scripts/stack.sh down

# Every part with its port, pid and health; exits 1 if a part is down.
status:
	scripts/stack.sh status

install:
	scripts/stack.sh install

# What `make bench` needs besides the stack: wrk (the edge cross-check), apt-get installed
# when `wrk` is not on PATH (needs root then); `make up` never needs it.
bench-tools:
	scripts/stack.sh install-bench-tools

# `make up`, then a demo event, published, and a short sale through the edge (scripts/demo.sh).
demo: up
	scripts/demo.sh

# `make up`, then every baseline and a 200 000-buyer sale for 10 000 units in one run:
# the comparison table, also in target/bench/compare.json. Exits 1 if the audit fails.
bench: up bench-tools
	cargo build --release --quiet -p stampede-bench
	$(TARGET_DIR)/release/stampede-bench compare --buyers 200000 --units 10000 --connections 256

# `make up`, then MINUTES of steady purchases (200/s), a third cancelled, a third paid, a
# third timing out: the core's RSS and the 202 p99 every 10 s, rss_flat, the audit; in
# target/bench/soak.json and soak.svg. Exits 1 if the audit fails.
MINUTES ?= 10
soak: up
	cargo build --release --quiet -p stampede-bench
	$(TARGET_DIR)/release/stampede-bench soak --minutes $(MINUTES)

# `make up`, then every chaos experiment (scripts/chaos.sh): a sale with one fault injected
# mid-burst each (Redis, MariaDB, the broker, the core, the edge), the audit, one table row
# each. Exits 1 if one broke an invariant. `make test` runs a short version.
chaos: up
	cargo build --release --quiet -p stampede-bench
	scripts/chaos.sh

# The fresh-machine checks, fmt, clippy, unit tests; then, on a stack of their own, the
# unprivileged-start check, end-to-end tests, chaos (short), browser tests, API fuzz;
# last the cluster stack, short (scripts/test-cluster.sh --short). See scripts/test.sh.
test:
	scripts/test.sh

# The end-to-end tests against the cluster stack (STACK_MODE=cluster: Redis Cluster of 3
# masters + 3 replicas, two cores, two edges), with a Redis master and a core killed
# mid-sale (scripts/test-cluster.sh). `make test` runs a short version.
test-cluster:
	scripts/test-cluster.sh

# The fresh-machine checks alone, in seconds (`make test` runs them first): shellcheck,
# the install decision on an empty machine, docker-compose.yml against its schema and the stack.
check:
	scripts/check.sh

# For running `cargo test` by hand against the test stack.
TEST_ENV = STACK_DIR=$(CURDIR)/.stack-test EDGE_PORT=18080 CORE_PORT=18081 ADMIN_PORT=19091 \
	REDIS_PORT=16379 MYSQL_PORT=13306 NAMESRV_PORT=19876 BROKER_PORT=20911 OPS_PORT=18082 \
	PAYSIM_PORT=18092 CORE_PROFILE=dev
test-stack-up:
	$(TEST_ENV) scripts/stack.sh up
test-stack-down:
	$(TEST_ENV) scripts/stack.sh down
