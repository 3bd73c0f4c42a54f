#!/usr/bin/env bash
# Installs the npm test peers (judges written by others) into tests/tools/node_modules, and Debian's
# chromium for the web page's browser test (puppeteer-core drives it; it never downloads a browser).
# Idempotent.
set -euo pipefail
if ! command -v chromium >/dev/null 2>&1; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium
fi
cd "$(dirname "$0")/../tests/tools"
if [ ! -d node_modules ] || [ package.json -nt node_modules ]; then
  npm install --no-audit --no-fund --loglevel=error
  touch node_modules
fi
