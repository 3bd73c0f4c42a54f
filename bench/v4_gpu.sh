#!/usr/bin/env bash
# DeepSeek-V4 on one GPU (issue #20): the V4 GPU tests, then `bench model` on the V4 shape
# (bench/configs/deepseek-v4-shape: every per-layer dimension of transformers' DeepseekV4Config) cut
# to LAYERS layers with the compress ratios RATIOS, decode at batch 1-256 and 4K context, long context
# (32K, 128K) at batch 1 and 16 beside V2-Lite's MLA, with graphs and with --enforce-eager.
#   BELUGA=... TEST_GPU=... [OLD=beluga of the commit before, for a same-run baseline] bench/v4_gpu.sh
# TESTS=0 skips the tests, SHORT=0 the 4K points, LONG=0 the long-context ones, MLA=0 V2-Lite's, PROFILE=0
# the per-op profile, SERVE=0 the serving check; BIG=1 adds batch 64 and 256 at long context. Results in $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}
BELUGA=${BELUGA:-build/beluga}
TEST_GPU=${TEST_GPU:-build/test_gpu}
LAYERS=${LAYERS:-2}
RATIOS=${RATIOS:-128,4}
mkdir -p "$OUT"
export BELUGA_SOURCE_DIR=$PWD
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"

if [[ "${TESTS:-1}" != 0 ]]; then
  "$TEST_GPU" --gtest_filter="${FILTER:-*V4*:GpuGraphs.*:GpuOps.Moe*}" > "$OUT/test_gpu.txt" 2>&1
  echo "test_gpu rc $?" | tee -a "$OUT/test_gpu.txt"
  grep -E "^\[  (PASSED|FAILED) |FAILED  \]|graphs vs eager|\[v4 gpu\].*rows" "$OUT/test_gpu.txt"
fi

# The V4 shape with LAYERS layers (the first ones hash-routed as the full model's first three).
V4=$(mktemp -d)
python3 - "$V4" "$LAYERS" "$RATIOS" <<'EOF'
import json, sys
out, layers, ratios = sys.argv[1], int(sys.argv[2]), [int(r) for r in sys.argv[3].split(",")]
c = json.load(open("bench/configs/deepseek-v4-shape/config.json"))
c["num_hidden_layers"] = layers
c["compress_ratios"] = (ratios * layers)[:layers] + [0]
c["num_hash_layers"] = min(c["num_hash_layers"], max(1, layers // 2))
c["num_nextn_predict_layers"] = 0
json.dump(c, open(out + "/config.json", "w"), indent=1)
EOF
V2=bench/configs/deepseek-v2-lite/config.json

point() {  # name binary model args...
  local name=$1 bin=$2 model=$3
  shift 3
  "$bin" bench model --model "$model" --load-format dummy --device cuda --out "$OUT/$name.json" "$@" \
    > "$OUT/$name.txt" 2>&1
  echo "== $name (rc $?)"
  sed -n '/^decode steps/p;/^phase /,$p' "$OUT/$name.txt"
}
if [[ "${SHORT:-1}" != 0 ]]; then
  SHORTA=(--decode-batches 1,16,64,256 --decode-contexts 4096 --prefill-lens 2048 --steps 8)
  point v4_4k "$BELUGA" "$V4" "${SHORTA[@]}"
  point v4_4k_eager "$BELUGA" "$V4" "${SHORTA[@]}" --enforce-eager
  [[ -n "${OLD:-}" ]] && point v4_4k_before "$OLD" "$V4" "${SHORTA[@]}"
fi
if [[ "${LONG:-1}" != 0 ]]; then
  LONGA=(--max-model-len 140000 --decode-batches 1,16 --decode-contexts 32768,131072 --prefill-lens 2048 --steps 4)
  point v4_long "$BELUGA" "$V4" "${LONGA[@]}"
  [[ -n "${OLD:-}" ]] && point v4_long_before "$OLD" "$V4" "${LONGA[@]}"
fi
# Large batches at long context (their cache needs fewer layers on one GPU: LAYERS=1 RATIOS=4, a CSA layer).
if [[ "${BIG:-0}" != 0 ]]; then
  point v4_big_b64 "$BELUGA" "$V4" --max-model-len 140000 --decode-batches 64 --decode-contexts 4096,32768,131072 \
    --prefill-lens 2048 --steps 4
  point v4_big_b256 "$BELUGA" "$V4" --max-model-len 140000 --decode-batches 256 --decode-contexts 4096,32768 \
    --prefill-lens 2048 --steps 4
fi
# V2-Lite's MLA (V3's attention) at the same contexts; batch 16 at 128K does not fit an H100 (65 GB of
# cache beside 30 GB of weights).
if [[ "${MLA:-1}" != 0 ]]; then
  point mla_b1 "$BELUGA" "$V2" --max-model-len 140000 --decode-batches 1 --decode-contexts 4096,32768,131072 \
    --prefill-lens 2048 --steps 4
  point mla_b16 "$BELUGA" "$V2" --max-model-len 140000 --decode-batches 16 --decode-contexts 4096,32768 \
    --prefill-lens 2048 --steps 4
fi
# Where a decode step's time goes (every op synchronized and timed: eager, slower than the graphs).
if [[ "${PROFILE:-1}" != 0 ]]; then
  for b in 1 64; do
    BELUGA_CUDA_PROFILE=1 "$BELUGA" bench model --model "$V4" --load-format dummy --device cuda --enforce-eager \
      --decode-batches $b --decode-contexts 4096 --prefill-lens 512 --steps 8 > "$OUT/v4_profile_b$b.txt" 2>&1
    echo "== profile b=$b (prefill 512 + decode; rc $?)"
    grep -A40 "CUDA op profile" "$OUT/v4_profile_b$b.txt"
  done
fi

# serve on the GPU: the tiny fixture behind the OpenAI API, sampled requests at concurrency 16 (decode
# graphs with the device sampler), then one greedy chat completion.
if [[ "${SERVE:-1}" != 0 ]]; then
  PORT=18431
  "$BELUGA" serve tests/fixtures/dsv4-tiny --tokenizer tests/fixtures/dsv4-byte-tokenizer --device cuda \
    --port $PORT > "$OUT/serve.log" 2>&1 &
  SERVER=$!
  for _ in $(seq 1 60); do curl -sf localhost:$PORT/health > /dev/null && break; sleep 1; done
  "$BELUGA" bench serve --url http://127.0.0.1:$PORT --num-prompts 64 --max-concurrency 16 --input-len 128 \
    --output-len 64 --vocab-size 1000 > "$OUT/serve_bench.txt" 2>&1
  echo "== bench serve (rc $?)"
  tail -22 "$OUT/serve_bench.txt"
  curl -s localhost:$PORT/v1/chat/completions -H 'content-type: application/json' \
    -d '{"messages":[{"role":"user","content":"hello there"}],"max_tokens":16,"temperature":0}' | tee "$OUT/chat.json"
  echo
  kill $SERVER
  wait $SERVER 2> /dev/null
  grep -c -i "error" "$OUT/serve.log"
fi
exit 0
