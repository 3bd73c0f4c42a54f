#!/usr/bin/env bash
# Per-kernel time and DRAM bytes of one prefill of N tokens (default 512; eager, boost clocks), summed
# by kernel name. The dummy loader's fill kernels are left out by the name filter (profiling them
# costs minutes). bench/NOTES.md run 43 found the grouped expert kernel at 1.3 TB/s this way.
#   OUT=dir N=2048 bench/ncu_prefill.sh path/to/beluga
# KREGEX overrides the kernel-name filter (e.g. 'vt_transpose|rope|cache_write|add_kernel').
# FULL=1 instead: ncu --set full on COUNT launches (after SKIP) of the kernels matching KERNELS (default
# the expert tiles and the MLA prefill attention): issue-slot use, pipe utilisation, occupancy (runs
# 54, 55, 60).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
V2=bench/configs/deepseek-v2-lite/config.json
IDS=$(seq -s, 1 "${N:-512}")
if [[ "${FULL:-0}" == 1 ]]; then
  ncu --set full --import-source no -k "regex:${KERNELS:-mla_prefill|grouped_}" --launch-skip "${SKIP:-3}" \
    --launch-count "${COUNT:-3}" -o "$OUT/prefill" "$1" generate --device cuda --enforce-eager --load-format dummy \
    --model $V2 --prompt-ids "$IDS" --max-tokens 1 > "$OUT/ncu_prefill.log" 2>&1
  ncu --import "$OUT/prefill.ncu-rep" --page details > "$OUT/prefill_details.txt" 2>&1
  grep -E "^  [a-z_ ]+.*\)x\(|Duration|DRAM Throughput|L2 Cache Throughput|Compute \(SM\) Throughput|Issue Slots Busy|Eligible Warps|Warp Cycles Per Issued|Registers Per|Achieved Occupancy|highest-utilized" \
    "$OUT/prefill_details.txt" | cut -c1-150
  exit 0
fi
ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv \
  -k "regex:${KREGEX:-grouped|mla_|moe_|rmsnorm|nvjet|silu|gather|gemv|cutlass|sm90}" "$1" generate --device cuda \
  --enforce-eager --load-format dummy --model $V2 --prompt-ids "$IDS" --max-tokens 1 > "$OUT/ncu_prefill.csv" 2>/dev/null
python3 - "$OUT/ncu_prefill.csv" <<'PY'
import collections, csv, sys
hdr, data = None, []
for r in csv.reader(open(sys.argv[1])):
    if r and r[0] == "ID":
        hdr = r
    elif hdr and len(r) == len(hdr):
        data.append(dict(zip(hdr, r)))
agg = collections.defaultdict(lambda: [0.0, 0, 0.0])  # us, launches, bytes
for d in data:
    a = agg[d["Kernel Name"][:90]]
    v, u = float(d["Metric Value"].replace(",", "")), d["Metric Unit"]
    if d["Metric Name"] == "gpu__time_duration.sum":
        a[0] += v / 1000 if u in ("nsecond", "ns") else v if u in ("usecond", "us") else v * 1000
        a[1] += 1
    else:
        a[2] += v * {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}.get(u, 1)
for k, (t, c, b) in sorted(agg.items(), key=lambda x: -x[1][0])[:16]:
    print(f"{t:9.1f} us {c:5d} x {t / c:8.2f} us {b / 1e9:7.3f} GB {b / 1e3 / max(t, 1e-9):6.0f} GB/s  {k}")
print("total kernel us", sum(a[0] for a in agg.values()))
PY
