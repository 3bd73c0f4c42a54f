#!/usr/bin/env bash
# Kernel times of one batch-1 decode step at a given context (ncu at boost clocks, warm caches, eager):
# a PROMPT-token prompt (default 1000: profile at the context you benchmark; 4-token prompts hid a
# 38 us attention kernel), then 3 tokens; the last step's kernels summed per name.
#   OUT=dir bench/ncu_step.sh path/to/beluga
# FULL=1 instead: ncu --set full on one layer's kernels (KERNELS: a name regex; SKIP matching launches
# past the prompt's prefill, then COUNT of them): issue-slot use, stall reasons, DRAM throughput per
# kernel. Session 5 found its two biggest wins this way (bench/NOTES.md run 38).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
V2=bench/configs/deepseek-v2-lite/config.json
IDS=$(seq -s, 1 "${PROMPT:-1000}")
if [[ "${FULL:-0}" == 1 ]]; then
  K=${KERNELS:-mla_decode|mla_combine_uv|norm_gemv|mla_prepare_uk|token_gate_up|token_down|moe_gate_kernel|gemv_kernel<__nv_bfloat16}
  ncu --set full --import-source no -k "regex:$K" --launch-skip "${SKIP:-300}" --launch-count "${COUNT:-8}" \
    -o "$OUT/layer" "$1" generate --device cuda --enforce-eager --load-format dummy --model $V2 --prompt-ids "$IDS" \
    --max-tokens 3 > "$OUT/ncu_layer.log" 2>&1
  ncu --import "$OUT/layer.ncu-rep" --page details > "$OUT/layer_details.txt" 2>&1
  grep -E "^  [a-z_ ]+.*\)x\(|Duration|DRAM Throughput|Issue Slots Busy|Warp Cycles Per Issued|Executed Instructions  |Achieved Occupancy" \
    "$OUT/layer_details.txt" | cut -c1-150
  exit 0
fi
ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv "$1" generate --device cuda \
  --enforce-eager --load-format dummy --model $V2 --prompt-ids "$IDS" --max-tokens 3 > "$OUT/ncu_step.csv" 2>/dev/null
# A step ends with the LM head (the only F32-output GEMV): the kernels after the second-to-last one.
N=$(python3 - "$OUT/ncu_step.csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
hdr = None; data = []
for r in rows:
    if r and r[0] == "ID": hdr = r; continue
    if hdr and len(r) == len(hdr): data.append(dict(zip(hdr, r)))
idx = [i for i, d in enumerate(data) if "gemv_kernel<float" in d["Kernel Name"]]
print(idx[-1] - idx[-2])
PY
)
python3 bench/ncu_summary.py "$OUT/ncu_step.csv" "$N"
