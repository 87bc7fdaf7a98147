#!/usr/bin/env bash
# `make test`'s formatting and lint steps need the toolchain's rustfmt and clippy, which
# rustup's minimal profile leaves out: each one missing is added with rustup; without
# rustup (a toolchain from elsewhere), the error names the component.
set -euo pipefail
for pair in fmt:rustfmt clippy:clippy; do
  sub=${pair%%:*} component=${pair##*:}
  cargo "$sub" --version >/dev/null 2>&1 && continue
  command -v rustup >/dev/null 2>&1 || {
    echo "rust-components: cargo $sub does not run and rustup is not on PATH: install the toolchain's $component component" >&2
    exit 1
  }
  echo "adding the toolchain's $component component (rustup component add $component)"
  rustup component add "$component"
  cargo "$sub" --version >/dev/null 2>&1 || {
    echo "rust-components: rustup added $component, yet cargo $sub does not run" >&2
    exit 1
  }
done
