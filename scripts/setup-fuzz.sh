#!/usr/bin/env bash
# The fuzzing toolchain (tests/fuzz, scripts/fuzz.sh): clang and its libFuzzer/sanitizer runtimes from
# Debian 12 (clang-14; libclang-rt-14-dev holds libclang_rt.fuzzer). Idempotent; root or sudo.
set -euo pipefail
PACKAGES=(clang clang-14 libclang-rt-14-dev)
source "$(dirname "$0")/apt-packages.sh"
apt_install setup-fuzz "${PACKAGES[@]}"
