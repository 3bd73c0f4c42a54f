#!/usr/bin/env bash
# The fuzzing toolchain (tests/fuzz, scripts/fuzz.sh): clang and its libFuzzer/sanitizer runtimes from
# Debian 12 (clang-14; libclang-rt-14-dev holds libclang_rt.fuzzer). Idempotent; root or sudo.
set -euo pipefail
PACKAGES=(clang clang-14 libclang-rt-14-dev)
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup-fuzz: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
