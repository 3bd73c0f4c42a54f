#!/usr/bin/env bash
# Issue #25, the overlap: the engine loop as it was (OLD: step N+1 built and launched once step N's
# tokens are applied), as it is (NEW: N+1 launched early, its tokens resolved by the runner), and the
# serial reference (NEW --no-async-scheduling), on the demo model (real weights; batch 1, 16, 64) and
# the V2-Lite shape (dummy weights; 16, 64), greedy and sampled (temperature 0.8, top_p 0.95: device
# sampling; KINDS adds "penalty": penalties too). Each point: `bench serve` numbers and the trace summary
# (host time per iteration, the runner's gap between forwards, steps launched early).
# usage: OLD=path/to/old/beluga [NEW=build/beluga] [OUT_DIR=bench/results/overlap] [MODELS="demo v2"]
#        [DEMO_CONC="1 16 64"] [V2_CONC="16 64"] [KINDS="greedy sampled"] [SETTINGS="old new serial"]
#        bench/overlap_gpu.sh
set -euo pipefail
NEW=${NEW:-build/beluga}
OLD=${OLD:?the previous beluga binary}
OUT_DIR=${OUT_DIR:-bench/results/overlap}
DEMO=${DEMO:-models/beluga-demo-coder-mtp}
V2=${V2:-bench/configs/deepseek-v2-lite}
DEMO_CONC=${DEMO_CONC:-1 16 64}
V2_CONC=${V2_CONC:-16 64}
MODELS=${MODELS:-demo v2}
KINDS=${KINDS:-greedy sampled}  # also: penalty (sampled with repetition, presence and frequency penalties)
SETTINGS=${SETTINGS:-old new serial}
mkdir -p "$OUT_DIR"
source "$(dirname "$0")/serve_lib.sh"
logs=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$logs"' EXIT

serve() {  # name binary model extra-args...
  local name=$1 bin=$2 model=$3
  shift 3
  local args=(serve --device cuda --model "$model" --max-num-seqs 256 --no-access-log --port 0)
  [ "$model" = "$V2" ] && args+=(--load-format dummy --tokenizer "$DEMO" --kv-cache-mb 32768)
  BELUGA_TRACE="$OUT_DIR/$name.trace.json" start_server "$logs/$name" "$bin" "${args[@]}" "$@"
}
point() {  # name extra-json bench-args...
  local name=$1 extra=$2
  shift 2
  echo "== $name"
  "$NEW" bench serve --url "http://127.0.0.1:$port" --seed 0 --request-extra "$extra" \
    --out "$OUT_DIR/$name.json" "$@" 2>&1 | grep -E "Failed|Output token|TPOT|ITL " || true
}
body() {  # the request fields of a kind
  case $1 in
    greedy) echo '{"temperature":0,"ignore_eos":true}' ;;
    sampled) echo '{"temperature":0.8,"top_p":0.95,"ignore_eos":true}' ;;
    penalty) echo '{"temperature":0.8,"top_p":0.95,"repetition_penalty":1.1,"presence_penalty":0.5,"frequency_penalty":0.3,"ignore_eos":true}' ;;
  esac
}
for model in $MODELS; do
  for setting in $SETTINGS; do
    bin=$NEW
    extra=()
    [ "$setting" = old ] && bin=$OLD
    [ "$setting" = serial ] && extra=(--no-async-scheduling)
    name=$model-$setting
    if [ $model = demo ]; then
      for c in $DEMO_CONC; do
        serve "$name-c$c" "$bin" "$DEMO" "${extra[@]}"
        point "$name-c$c-warmup" '{}' --num-prompts 64 --input-len 256 --output-len 32 --max-concurrency 64
        for kind in $KINDS; do
          x=$(body $kind)
          point "$name-$kind-c$c" "$x" --num-prompts $((c < 16 ? 16 : c * 2)) --input-len 256 --output-len 256 \
            --max-concurrency "$c"
        done
        stop_server
        echo "-- trace $name-c$c"
        python3 scripts/trace_summary.py "$OUT_DIR/$name-c$c.trace.json" --skip-first 20 | tail -3 || true
        rm -f "$OUT_DIR/$name-c$c.trace.json"
      done
    else
      serve "$name" "$bin" "$V2" "${extra[@]}"
      point "$name-warmup" '{}' --num-prompts 32 --input-len 1024 --output-len 16 --max-concurrency 32
      for c in $V2_CONC; do
        for kind in $KINDS; do
          x=$(body $kind)
          point "$name-$kind-c$c" "$x" --num-prompts $((c * 2)) --input-len 1024 --output-len 256 \
            --max-concurrency "$c"
        done
      done
      stop_server
      echo "-- trace $name"
      python3 scripts/trace_summary.py "$OUT_DIR/$name.trace.json" --skip-first 20 | tail -3 || true
      rm -f "$OUT_DIR/$name.trace.json"
    fi
  done
done
