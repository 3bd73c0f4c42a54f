#!/usr/bin/env bash
# Prefill/decode disaggregation on one GPU: a colocated `beluga serve --device cuda`, then a prefill and
# a decode engine on the same GPU behind `beluga router --prefill --decode`, each loaded by the same
# Poisson trace (`beluga bench serve`, random prompts); prints both reports and the engines' KV
# transfer counters (bytes and seconds sent: the transfer's GB/s).
# usage: [BELUGA=build/beluga] [MODEL=bench/configs/deepseek-v2-lite] [TOKENIZER=models/beluga-demo-coder-mtp]
#        [RATE=4] [PROMPTS=64] [INPUT_LEN=2048] [OUTPUT_LEN=128] [CONCURRENCY=32] [KV_MB=8192] bench/pd_gpu.sh
set -euo pipefail
BELUGA=${BELUGA:-build/beluga}
MODEL=${MODEL:-bench/configs/deepseek-v2-lite}
TOKENIZER=${TOKENIZER:-models/beluga-demo-coder-mtp}
RATE=${RATE:-4} PROMPTS=${PROMPTS:-64} INPUT_LEN=${INPUT_LEN:-2048} OUTPUT_LEN=${OUTPUT_LEN:-128}
CONCURRENCY=${CONCURRENCY:-32} KV_MB=${KV_MB:-8192}
logs=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$logs"' EXIT
common=(--device cuda --model "$MODEL" --load-format dummy --tokenizer "$TOKENIZER" --kv-cache-mb "$KV_MB" --no-access-log)

start() {  # name, marker, args...: starts it, waits for "MARKER ... http://127.0.0.1:PORT", sets $port
  local name=$1 marker=$2
  shift 2
  "$BELUGA" "$@" --port 0 >"$logs/$name" 2>&1 &
  pids+=($!)
  port=
  for _ in $(seq 1800); do
    port=$(grep "$marker" "$logs/$name" | sed -n 's/.*http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' | head -1 || true)
    [ -n "$port" ] && return 0
    kill -0 "${pids[-1]}" 2>/dev/null || break  # it exited (a bad flag, a model it refuses)
    sleep 0.1
  done
  cat "$logs/$name"
  exit 1
}
trace() {
  "$BELUGA" bench serve --url "http://127.0.0.1:$1" --dataset random --num-prompts "$PROMPTS" --input-len "$INPUT_LEN" \
    --output-len "$OUTPUT_LEN" --request-rate "$RATE" --max-concurrency "$CONCURRENCY" --seed 0
}

echo "== colocated: one engine"
start colocated "serving " serve "${common[@]}"
trace "$port"
kill "${pids[@]}"
wait 2>/dev/null || true
pids=()

echo "== disaggregated: a prefill and a decode engine on the same GPU"
start prefill "serving " serve "${common[@]}" --role prefill --kv-host-gb 16
p=$port
start decode "serving " serve "${common[@]}" --role decode --kv-host-gb 16
d=$port
start router "routing to " router --model "$TOKENIZER" --prefill "http://127.0.0.1:$p" --decode "http://127.0.0.1:$d" \
  --health-interval-ms 100
r=$port
sleep 1
trace "$r"
echo "== KV transfer counters"
curl -s "http://127.0.0.1:$p/metrics" | grep -E '^beluga_kv_transfer(s|_bytes|_seconds)_total' || true
curl -s "http://127.0.0.1:$d/metrics" | grep -E '^beluga_kv_transfer_bytes_total|^beluga_kv_hit_tokens_total.*host' || true
curl -s "http://127.0.0.1:$r/metrics" | grep -E '^beluga_router_prefill' || true
