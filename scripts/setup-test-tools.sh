#!/usr/bin/env bash
# Installs the npm test peers (judges written by others) into tests/tools/node_modules. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/../tests/tools"
if [ ! -d node_modules ] || [ package.json -nt node_modules ]; then
  npm install --no-audit --no-fund --loglevel=error
  touch node_modules
fi
