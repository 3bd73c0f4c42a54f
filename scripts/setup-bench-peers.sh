#!/usr/bin/env bash
# Installs the benchmark peers (other implementations that bench/ scripts run beside Beluga, e.g.
# @mlc-ai/web-xgrammar for bench/xgrammar_peer.mjs) into bench/peers/node_modules. Kept apart from
# tests/tools, which every CI run installs: no test needs these. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/../bench/peers"
if [ ! -d node_modules ] || [ package.json -nt node_modules ]; then
  npm install --no-audit --no-fund --loglevel=error
  touch node_modules
fi
