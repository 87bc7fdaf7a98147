# shellcheck shell=bash
# Sourced by scripts/stack.sh (its settings and helpers are in scope). The install decision and the install: Debian packages, the RocketMQ build, the core.

# ---------------------------------------------------------------- install
# What a fresh machine lacks, decided without changing anything: the Debian packages not
# installed, and whether the RocketMQ binaries must be built. `install --dry-run` prints it.
missing_packages() {
  local p
  for p in $APT_PACKAGES; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || printf '%s\n' "$p"
  done
  return 0
}
rocketmq_missing() { # 0 = the name server or the broker must be built
  local b
  for b in rocketmq-namesrv-rust rocketmq-broker-rust; do
    [ -x "$CARGO_BIN/$b" ] || return 0
  done
  # Binaries from another version count as missing. `cargo install --list` prints nothing
  # at all on a machine that never installed a crate: no match is an answer, not a failure.
  local listed
  listed=$(cargo install --list 2>/dev/null || true)
  [ "$(grep -cE "^rocketmq-(namesrv|broker) v$ROCKETMQ_VERSION:" <<<"$listed" || true)" -lt 2 ]
}
# Why the Rust toolchain cannot build the workspace, or nothing: cargo not on PATH, or
# rustc older than the workspace's rust-version.
rust_problem() {
  command -v cargo >/dev/null 2>&1 || { printf 'cargo is not on PATH'; return; }
  local have
  have=$(rustc --version 2>/dev/null | awk '{print $2}')
  if [ -z "$have" ]; then printf 'rustc does not run'; return; fi
  [ "$(printf '%s\n%s\n' "$RUST_MIN" "${have%%-*}" | sort -V | head -n 1)" = "$RUST_MIN" ] ||
    printf 'rustc is %s' "$have"
}
# The distro's services, started by apt-get when it installed redis-server or
# mariadb-server, would answer on REDIS_PORT and MYSQL_PORT in place of the stack's own
# (Redis without its AOF settings, MariaDB without its flags or state dir; both unknown
# to `make down` and to the chaos suite's kills): stopped and disabled, once, when this
# install put them there. Without systemctl (a container) nothing was started.
quiet_distro_service() { # SERVICE PORT_VARIABLE
  command -v systemctl >/dev/null 2>&1 || return 0
  systemctl is-active --quiet "$1" 2>/dev/null || return 0
  say "  stopping and disabling Debian's $1 service (the stack runs its own)"
  systemctl disable --now "$1" >/dev/null 2>&1 ||
    say "  note: could not stop it; set $2 to another port if it answers on ${!2}"
}
install() {
  local dry=${1:-} missing
  missing=$(missing_packages | tr '\n' ' ')
  missing=${missing% }
  if [ "$dry" = --dry-run ]; then
    say "install plan (--dry-run: nothing is changed)"
    if [ -n "$missing" ]; then say "  apt-get install: $missing"; else say "  apt-get: nothing to install"; fi
    if rocketmq_missing; then
      say "  cargo install: rocketmq-namesrv@$ROCKETMQ_VERSION rocketmq-broker@$ROCKETMQ_VERSION into $CARGO_BIN (build kept in $ROCKETMQ_BUILD_DIR)"
    else
      say "  cargo install: nothing to build (RocketMQ $ROCKETMQ_VERSION in $CARGO_BIN)"
    fi
    local rust
    rust=$(rust_problem)
    [ -z "$rust" ] || say "  note: $rust; install a Rust toolchain $RUST_MIN or later first (rustup)"
    return 0
  fi
  # Checked before anything is installed: a machine without the toolchain learns it now,
  # not after the packages, from a failed build.
  local rust
  rust=$(rust_problem)
  [ -z "$rust" ] || die "$rust: install a Rust toolchain $RUST_MIN or later (rustup, https://rustup.rs), then run this again"
  if [ -n "$missing" ]; then
    step="apt-get install $missing"
    say "installing Debian packages: $missing"
    [ "$(id -u)" = 0 ] || die "installing packages needs root (apt-get): $missing"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # shellcheck disable=SC2086 # one word per package
    apt-get install -y -qq --no-install-recommends $missing >/dev/null
    case " $missing " in *" redis-server "*) quiet_distro_service redis-server REDIS_PORT ;; esac
    case " $missing " in *" mariadb-server "*) quiet_distro_service mariadb MYSQL_PORT ;; esac
  fi
  if rocketmq_missing; then
    step="cargo install rocketmq $ROCKETMQ_VERSION"
    say "building the RocketMQ name server and broker $ROCKETMQ_VERSION (cargo install, about 16 min on 2 cores the first time)"
    mkdir -p "$ROCKETMQ_BUILD_DIR"
    CARGO_TARGET_DIR=$ROCKETMQ_BUILD_DIR cargo install --locked --quiet \
      "rocketmq-namesrv@$ROCKETMQ_VERSION" "rocketmq-broker@$ROCKETMQ_VERSION"
  fi
  # shellcheck disable=SC2034 # read by the ERR trap in scripts/stack.sh
  step=install
}

build_core() {
  # cargo decides whether anything changed; a no-op build takes a second.
  (cd "$ROOT" && cargo build --profile "$CORE_PROFILE" --quiet -p stampede-core)
}

# ---------------------------------------------------------------- bench tools
# What `make bench` needs besides the stack (`make up` never does): wrk, the second load
# generator of the edge cross-check (bench/src/wrk.rs). A tool is missing when its command
# is not on PATH; each one's Debian package has its name. STACK_BENCH_TOOLS replaces the
# list (scripts/check.sh adds one no machine has).
BENCH_TOOLS=${STACK_BENCH_TOOLS:-wrk}
missing_bench_tools() {
  local t
  for t in $BENCH_TOOLS; do
    command -v "$t" >/dev/null 2>&1 || printf '%s\n' "$t"
  done
  return 0
}
install_bench_tools() {
  local dry=${1:-} missing
  missing=$(missing_bench_tools | tr '\n' ' ')
  missing=${missing% }
  if [ -z "$missing" ]; then
    say "bench tools: nothing to install ($BENCH_TOOLS on PATH)"
    return 0
  fi
  if [ "$dry" = --dry-run ]; then
    say "bench tools plan (--dry-run: nothing is changed)"
    say "  apt-get install: $missing"
    return 0
  fi
  step="apt-get install $missing (bench tools)"
  say "installing the bench's tools: $missing"
  [ "$(id -u)" = 0 ] ||
    die "installing the bench's tools needs root (apt-get install $missing); install them as root, or run stampede-bench compare yourself (it skips the wrk cross-check without wrk)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # shellcheck disable=SC2086 # one word per package
  apt-get install -y -qq --no-install-recommends $missing >/dev/null
  missing=$(missing_bench_tools | tr '\n' ' ')
  [ -z "$missing" ] || die "installed, yet not on PATH: ${missing% }"
  # shellcheck disable=SC2034 # read by the ERR trap in scripts/stack.sh
  step="install bench tools"
}
