#!/usr/bin/env bash
# Installs every Debian package Beluga's build and tests need. Idempotent; run as root or with sudo.
# Test-only npm tools are installed by scripts/setup-test-tools.sh (called by `make test`).
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libboost-dev libpcre2-dev libxxhash-dev libomp-dev liburing-dev
  clang-format python3 curl
  json-schema-test-suite
  manpages-zh manpages-ja
)
# Node.js (for the npm test tools) may come from Debian or from NodeSource; only install when absent.
command -v npm >/dev/null 2>&1 || PACKAGES+=(nodejs npm)

source "$(dirname "$0")/apt-packages.sh"
apt_install setup "${PACKAGES[@]}"
