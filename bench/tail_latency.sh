#!/usr/bin/env bash
# Tail latency under Poisson arrivals, the latency policy off vs on (src/engine/latency_policy.h): one
# `beluga serve` per setting, loaded at once by two `beluga bench serve` streams of the same seed —
# "long" (long prompts, short answers) and "decode" (short prompts, long answers), so prompts arrive
# while decodes run. Prints both reports per setting (TTFT p50/p99, TPOT p50, per-token ITL p99,
# throughput) and writes JSON to $OUT_DIR.
# usage: [BELUGA=build/beluga] [DEVICE=cpu|cuda] [MODEL=models/beluga-demo-coder-mtp] [LOAD=] [TOKENIZER=]
#        [LONG_RATE=1] [DECODE_RATE=1] [PROMPTS=24] [LONG_IN=1024] [LONG_OUT=16] [DECODE_IN=32]
#        [DECODE_OUT=128] [ITL_MS=30] [TTFT_MS=2000] [EXTRA=] [OUT_DIR=bench/results/tail] bench/tail_latency.sh
# H200, V2-Lite shape (dummy weights):
#   DEVICE=cuda MODEL=bench/configs/deepseek-v2-lite LOAD=dummy TOKENIZER=models/beluga-demo-coder-mtp \
#   LONG_RATE=8 DECODE_RATE=16 PROMPTS=256 LONG_IN=1024 LONG_OUT=256 DECODE_IN=128 DECODE_OUT=256 \
#   ITL_MS=25 TTFT_MS=2000 EXTRA="--kv-cache-mb 16384" bench/tail_latency.sh
set -euo pipefail
BELUGA=${BELUGA:-build/beluga}
DEVICE=${DEVICE:-cpu}
MODEL=${MODEL:-models/beluga-demo-coder-mtp}
LOAD=${LOAD:-} TOKENIZER=${TOKENIZER:-}
LONG_RATE=${LONG_RATE:-1} DECODE_RATE=${DECODE_RATE:-1} PROMPTS=${PROMPTS:-24}
LONG_IN=${LONG_IN:-1024} LONG_OUT=${LONG_OUT:-16} DECODE_IN=${DECODE_IN:-32} DECODE_OUT=${DECODE_OUT:-128}
ITL_MS=${ITL_MS:-30} TTFT_MS=${TTFT_MS:-2000} EXTRA=${EXTRA:-}
OUT_DIR=${OUT_DIR:-bench/results/tail}
mkdir -p "$OUT_DIR"
logs=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$logs"' EXIT
common=(--device "$DEVICE" --model "$MODEL" --no-access-log --port 0)
[ -n "$LOAD" ] && common+=(--load-format "$LOAD")
[ -n "$TOKENIZER" ] && common+=(--tokenizer "$TOKENIZER")
# shellcheck disable=SC2206
[ -n "$EXTRA" ] && common+=($EXTRA)

run() {  # name, serve args...
  local name=$1
  shift
  "$BELUGA" serve "${common[@]}" "$@" >"$logs/serve" 2>&1 &
  pid=$!
  port=
  for _ in $(seq 1800); do
    port=$(sed -n 's/.*serving .*http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$logs/serve" | head -1 || true)
    [ -n "$port" ] && break
    kill -0 "$pid" 2>/dev/null || break  # it exited: say why at once rather than after 180 s
    sleep 0.1
  done
  [ -n "$port" ] || { cat "$logs/serve"; exit 1; }
  local u="http://127.0.0.1:$port" x='{"ignore_eos":true}'
  "$BELUGA" bench serve --url "$u" --dataset random --num-prompts "$PROMPTS" --input-len "$LONG_IN" \
    --output-len "$LONG_OUT" --request-rate "$LONG_RATE" --seed 1 --request-extra "$x" \
    --slo "ttft_ms=$TTFT_MS" --out "$OUT_DIR/$name-long.json" >"$logs/long" 2>&1 &
  local lp=$!
  "$BELUGA" bench serve --url "$u" --dataset random --num-prompts "$PROMPTS" --input-len "$DECODE_IN" \
    --output-len "$DECODE_OUT" --request-rate "$DECODE_RATE" --seed 2 --request-extra "$x" \
    --slo "ttft_ms=$TTFT_MS,tpot_ms=$ITL_MS" --out "$OUT_DIR/$name-decode.json" >"$logs/decode" 2>&1
  wait "$lp"
  echo "== $name: long prompts"; cat "$logs/long"
  echo "== $name: decodes"; cat "$logs/decode"
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  pid=
}

run off
run on --itl-target-ms "$ITL_MS" --ttft-slo-ms "$TTFT_MS"
