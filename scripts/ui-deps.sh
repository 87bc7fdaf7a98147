#!/usr/bin/env bash
# What the browser tests need: Debian's Chromium, Node.js and npm (apt-get, as root),
# and ui-tests/node_modules (npm ci, only when package-lock.json changed since the last).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
missing=()
command -v chromium >/dev/null || missing+=(chromium)
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
  [ "$(id -u)" = 0 ] || { echo "the browser tests need: ${missing[*]} (apt-get, as root)" >&2; exit 1; }
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# npm ci only when the lock changed since the last install.
if ! cmp -s ui-tests/package-lock.json ui-tests/node_modules/.installed-lock.json; then
  (cd ui-tests && npm ci --no-audit --no-fund --silent && cp package-lock.json node_modules/.installed-lock.json)
fi
