#!/usr/bin/env bash
# Builds (unless BUILD=0) and runs the GPU tests on a machine with an NVIDIA Hopper GPU.
#   tests/gpu/run.sh                  # configure + build build-cuda, run test_gpu
#   BUILD=0 BUILD_DIR=build-cuda tests/gpu/run.sh   # run a build made elsewhere (e.g. carried over)
# Extra arguments go to the test binary (e.g. --gtest_filter=GpuOps.*).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=${BUILD_DIR:-build-cuda}
if [[ "${BUILD:-1}" != 0 ]]; then
  cmake -S . -B "$BUILD_DIR" -DBELUGA_CUDA=ON -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$BUILD_DIR" --target test_gpu beluga -j "${JOBS:-$(nproc)}"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
"$BUILD_DIR/test_gpu" "$@"
