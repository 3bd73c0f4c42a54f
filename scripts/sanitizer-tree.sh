#!/usr/bin/env bash
# Configures the sanitizer build tree (default build-asan) when it is not configured yet: clang,
# ASan+UBSan, the libFuzzer targets beside the tests (BELUGA_FUZZ). One tree serves `make test-asan`
# and `make fuzz`/`make fuzz-ci`, so CI compiles the instrumented library once.
#   scripts/sanitizer-tree.sh [DIR]
# clang rather than GCC: libFuzzer needs it, and it compiles the instrumented code in about half
# GCC 12's time (measured on src/router/prefill_call.cc: 54 s vs 79 s; a server test TU 42 s vs 81 s).
# -O1 -gline-tables-only for the library (ASan's stack traces need only line tables), with the
# libraries' assertions on (Boost, nlohmann::json); the tests' own TUs at -O0 (BELUGA_TEST_OPT).
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="${1:-build-asan}"
bash scripts/setup-fuzz.sh
if [ ! -f "$DIR/build.ninja" ]; then
  CC=clang CXX=clang++ cmake -S . -B "$DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBELUGA_SANITIZE=ON \
    -DBELUGA_FUZZ=ON -DBELUGA_CUDA=OFF "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only" >/dev/null
fi
