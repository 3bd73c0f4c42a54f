#!/usr/bin/env bash
# Installs the npm test peers (judges written by others) into tests/tools/node_modules, and Debian's
# chromium for the web page's browser test (puppeteer-core drives it; it never downloads a browser).
# Idempotent.
set -euo pipefail
source "$(dirname "$0")/apt-packages.sh"
apt_install setup-test-tools chromium
cd "$(dirname "$0")/../tests/tools"
if [ ! -d node_modules ] || [ package.json -nt node_modules ]; then
  npm install --no-audit --no-fund --loglevel=error
  touch node_modules
fi
