#!/usr/bin/env bash
# One device session's checks and benchmarks, results under $OUT (default ./gpu-out):
#   GPU tests, the V2-Lite dummy sweep (CUDA graphs, then --enforce-eager at batch 1 and 16),
#   greedy `generate --device cuda` on the demo model, and `bench serve` against `serve --device cuda`.
# BELUGA=path/to/beluga (CUDA build) and TEST_GPU=path/to/test_gpu; HF=1 also runs the transformers peer;
# SERVE=0 skips the serving benchmark. The log ends with a summary of the verdicts (tests, greedy match, serve).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}
BELUGA=${BELUGA:-build-cuda/beluga}
TEST_GPU=${TEST_GPU:-build-cuda/test_gpu}
mkdir -p "$OUT"
export BELUGA_SOURCE_DIR=${BELUGA_SOURCE_DIR:-$PWD}  # fixtures for a test_gpu built elsewhere
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
V2=bench/configs/deepseek-v2-lite/config.json

"$TEST_GPU" 2>&1 | tail -40 > "$OUT/test_gpu.txt"; echo "test_gpu rc ${PIPESTATUS[0]}" | tee -a "$OUT/test_gpu.txt"
grep -E "PASSED|FAILED|graphs vs eager" "$OUT/test_gpu.txt"

"$BELUGA" bench model --model $V2 --load-format dummy --device cuda --out "$OUT/bench_graphs.json" \
  > "$OUT/bench_graphs.txt" 2>&1; sed -n '/^device floor/p;/^phase /,$p' "$OUT/bench_graphs.txt"
"$BELUGA" bench model --model $V2 --load-format dummy --device cuda --enforce-eager --decode-batches 1,16 \
  --decode-contexts 1024 --prefill-lens 512 --out "$OUT/bench_eager.json" > "$OUT/bench_eager.txt" 2>&1
tail -6 "$OUT/bench_eager.txt"

# Greedy on the demo model: the GPU (graphs) must give the CPU's tokens for the same prompt ids.
IDS="859,4017,313,344,1682,7055,2388,345,278,413,4306,385,293,6087,822,429,375,2135,6729,1183"  # import json / def read_json(path): """Load a JSON file ..."""
"$BELUGA" generate --model models/beluga-demo-coder-mtp --prompt-ids $IDS --max-tokens 48 --temperature 0 \
  --device cuda > "$OUT/gen_cuda.txt" 2> "$OUT/gen_cuda.err"
"$BELUGA" generate --model models/beluga-demo-coder-mtp --prompt-ids $IDS --max-tokens 48 --temperature 0 \
  > "$OUT/gen_cpu.txt" 2> "$OUT/gen_cpu.err"
if [[ -s "$OUT/gen_cpu.txt" ]] && cmp -s "$OUT/gen_cuda.txt" "$OUT/gen_cpu.txt"; then
  echo "generate: cuda == cpu" | tee "$OUT/gen_cmp.txt"
else
  echo "generate: cuda != cpu" | tee "$OUT/gen_cmp.txt"; head -5 "$OUT/gen_cuda.txt" "$OUT/gen_cpu.txt"
fi

if [[ "${SERVE:-1}" == 1 ]]; then
"$BELUGA" serve --device cuda --port 8765 > "$OUT/serve.log" 2>&1 &
SERVER=$!
for _ in $(seq 60); do curl -sf localhost:8765/health >/dev/null && break; sleep 1; done
"$BELUGA" bench serve --url http://127.0.0.1:8765 --dataset random --num-prompts 256 --request-rate inf \
  --max-concurrency 64 --input-len 256 --output-len 128 --out "$OUT/serve_random.json" > "$OUT/serve_random.txt" 2>&1
tail -15 "$OUT/serve_random.txt"
curl -s localhost:8765/metrics | grep -E "^beluga_(num_requests|kv_blocks_used)" | tee "$OUT/metrics_after.txt"
kill $SERVER; wait $SERVER 2>/dev/null
fi

if [[ "${HF:-0}" == 1 ]]; then
  python3 bench/hf_peer.py --config $V2 > "$OUT/hf_peer.txt" 2>&1; tail -8 "$OUT/hf_peer.txt"
fi

# The verdicts again at the end, where a caller that keeps only the log's tail still sees them.
echo "== summary"
grep -hE "PASSED|FAILED|test_gpu rc" "$OUT/test_gpu.txt"
cat "$OUT/gen_cmp.txt"
if [[ "${SERVE:-1}" == 1 ]]; then grep -hE "Failed requests|Output token throughput" "$OUT/serve_random.txt"; fi
