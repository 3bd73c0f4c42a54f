#!/usr/bin/env bash
# Per-kernel GPU times of a decoding server's steps (speculating or not), as served: `beluga serve` runs
# under ncu (CUDA graphs profiled node by node, clocks and caches left alone) while bench/spec_cpu.sh
# loads it at concurrency 1 (256-token outputs, 16 requests); kernels SKIP .. SKIP + COUNT of the
# server's run (past its warm-up and first requests) go to OUT/<spec>.csv, and bench/ncu_spec_steps.py
# splits them into forwards and MTP passes. ncu serializes kernels: each reads ~1.3 us over its
# in-graph time (bench/NOTES.md run 353: a 485 us K=3 step summed 683 us), so compare kernels, not steps.
#   BELUGA=build/beluga [SPEC=3/fixed] [SKIP=30000] [COUNT=300] [OUT=gpu-out] bench/ncu_spec.sh
# (NCU, DEVICE, OUTPUT_LEN, PROMPTS_PER_SLOT override the profiler's path and the load.)
set -euo pipefail
cd "$(dirname "$0")/.."
BELUGA=$(realpath "${BELUGA:-build/beluga}")
SPEC=${SPEC:-3/fixed}
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
csv=$(realpath "$OUT")/${SPEC//\//_}.csv
NCU=${NCU:-$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)}
wrap=$(mktemp)
trap 'rm -f "$wrap"' EXIT
# spec_cpu.sh runs $BELUGA for both `serve` and `bench serve`: only the server goes under ncu, and its
# SIGTERM is passed to the server itself so ncu sees it exit and writes the CSV.
cat > "$wrap" <<WRAP
#!/usr/bin/env bash
if [ "\$1" != serve ]; then exec "$BELUGA" "\$@"; fi
"$NCU" --graph-profiling node --clock-control none --cache-control none --metrics gpu__time_duration.sum \\
  --csv --page raw --launch-skip ${SKIP:-30000} --launch-count ${COUNT:-300} --log-file "$csv" "$BELUGA" "\$@" &
ncu_pid=\$!
trap 'pkill -TERM -f "^$BELUGA serve"' TERM INT
wait \$ncu_pid
wait \$ncu_pid
WRAP
chmod +x "$wrap"
BELUGA=$wrap DEVICE=${DEVICE:-cuda} OUTPUT_LEN=${OUTPUT_LEN:-256} PROMPTS_PER_SLOT=${PROMPTS_PER_SLOT:-16} CONCURRENCIES=1 \
  SPECS="$SPEC" bench/spec_cpu.sh
sleep 2  # ncu writes the CSV as the server exits
python3 bench/ncu_spec_steps.py "$csv"
