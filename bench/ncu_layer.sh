#!/usr/bin/env bash
# ncu --set full on one decode layer's kernels (batch 1, eager, a PROMPT-token prompt, default 1000):
# where each kernel's time goes (issue-slot use, stall reasons, DRAM throughput). Session 5 found its
# two biggest wins this way (bench/NOTES.md run 38). KERNELS: a regex of kernel names; SKIP: matching
# launches to skip first (past the prompt's prefill); COUNT: how many to profile.
#   OUT=dir bench/ncu_layer.sh path/to/beluga
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
V2=bench/configs/deepseek-v2-lite/config.json
IDS=$(seq -s, 1 "${PROMPT:-1000}")
K=${KERNELS:-mla_decode|mla_combine_uv|norm_gemv|mla_prepare_uk|token_gate_up|token_down|moe_gate_kernel|gemv_kernel<__nv_bfloat16}
ncu --set full --import-source no -k "regex:$K" --launch-skip "${SKIP:-300}" --launch-count "${COUNT:-8}" \
  -o "$OUT/layer" "$1" generate --device cuda --enforce-eager --load-format dummy --model $V2 --prompt-ids "$IDS" \
  --max-tokens 3 > "$OUT/ncu_layer.log" 2>&1
ncu --import "$OUT/layer.ncu-rep" --page details > "$OUT/layer_details.txt" 2>&1
grep -E "^  [a-z_ ]+.*\)x\(|Duration|DRAM Throughput|Issue Slots Busy|Warp Cycles Per Issued|Executed Instructions  |Achieved Occupancy" \
  "$OUT/layer_details.txt" | cut -c1-150
