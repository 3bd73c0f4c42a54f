#!/usr/bin/env bash
# A/B of CUDA builds in one device session: each binary's `bench model` rows, alternated ROUNDS times
# (default 2), so machine-to-machine spread (up to ~15 % between device sessions) cancels out.
#   bench/ab_gpu.sh path/to/beluga-A path/to/beluga-B [more...]
# BATCHES (default 1,16), CONTEXTS (1024), PREFILL (512), ROUNDS (2), MODEL (a config.json, default the
# DeepSeek-V2-Lite shape; bench/configs/llama-3-8b-shape/config.json for a dense GQA model).
set -uo pipefail
cd "$(dirname "$0")/.."
V2=${MODEL:-bench/configs/deepseek-v2-lite/config.json}
for ((i = 0; i < ${ROUNDS:-2}; ++i)); do
  for b in "$@"; do
    echo "== $b"
    "$b" bench model --model $V2 --load-format dummy --device cuda --decode-batches "${BATCHES:-1,16}" \
      --decode-contexts "${CONTEXTS:-1024}" --prefill-lens "${PREFILL:-512}" 2>&1 | grep -E "^(decode|prefill)  "
  done
done
