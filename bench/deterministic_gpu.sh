#!/usr/bin/env bash
# Issue #25, the cost of --deterministic on CUDA: `bench serve` on the demo model (real weights) and the
# V2-Lite shape (dummy weights), the same binary with and without the mode, greedy and sampled
# (temperature 0.8, top_p 0.95), 256 -> 256 tokens at each concurrency; one server per (model, mode).
# usage: [BIN=build/beluga] [OUT_DIR=bench/results/deterministic] [MODELS="demo v2"] [DEMO_CONC="1 16 64"]
#        [V2_CONC="1 16 64"] [KINDS="greedy sampled"] bench/deterministic_gpu.sh
set -euo pipefail
BIN=${BIN:-build/beluga}
OUT_DIR=${OUT_DIR:-bench/results/deterministic}
DEMO=${DEMO:-models/beluga-demo-coder-mtp}
V2=${V2:-bench/configs/deepseek-v2-lite}
MODELS=${MODELS:-demo v2}
DEMO_CONC=${DEMO_CONC:-1 16 64}
V2_CONC=${V2_CONC:-1 16 64}
KINDS=${KINDS:-greedy sampled}
mkdir -p "$OUT_DIR"
source "$(dirname "$0")/serve_lib.sh"
logs=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$logs"' EXIT

serve() {  # name model extra-args...
  local name=$1 model=$2
  shift 2
  local args=(serve --device cuda --model "$model" --max-num-seqs 256 --no-access-log --port 0)
  [ "$model" = "$V2" ] && args+=(--load-format dummy --tokenizer "$DEMO" --kv-cache-mb 32768 --max-model-len 8192)
  start_server "$logs/$name" "$BIN" "${args[@]}" "$@"
}
point() {  # name extra-json bench-args...
  local name=$1 extra=$2
  shift 2
  echo "== $name"
  "$BIN" bench serve --url "http://127.0.0.1:$port" --seed 0 --request-extra "$extra" \
    --out "$OUT_DIR/$name.json" "$@" 2>&1 | grep -E "Failed|Output token|TPOT|TTFT" || true
}
body() {
  case $1 in
    greedy) echo '{"temperature":0,"ignore_eos":true}' ;;
    sampled) echo '{"temperature":0.8,"top_p":0.95,"ignore_eos":true}' ;;
  esac
}
for model in $MODELS; do
  path=$DEMO conc=$DEMO_CONC
  [ "$model" = v2 ] && path=$V2 conc=$V2_CONC
  for mode in default deterministic; do
    extra=()
    [ "$mode" = deterministic ] && extra=(--deterministic)
    name=$model-$mode
    serve "$name" "$path" "${extra[@]}"
    point "$name-warmup" '{}' --num-prompts 64 --input-len 256 --output-len 32 --max-concurrency 64
    for c in $conc; do
      for kind in $KINDS; do
        point "$name-$kind-c$c" "$(body "$kind")" --num-prompts $((c < 16 ? 16 : c * 2)) --input-len 256 \
          --output-len 256 --max-concurrency "$c"
      done
    done
    stop_server
  done
done
