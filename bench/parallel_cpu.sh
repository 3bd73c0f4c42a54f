#!/usr/bin/env bash
# Attention data parallelism against replicated expert parallelism and tensor parallelism on CPU
# thread ranks: the model (default the built-in demo) served as one rank, as N expert-parallel ranks
# that each step the whole batch (--expert-parallel-size N: attention and dense layers replicated,
# routed experts split), as N data-parallel ranks that each step only their own sequences
# (--data-parallel-size N: a KV cache per rank, routed experts split) and as N tensor-parallel ranks
# (--tensor-parallel-size N: heads and dense layers split, routed experts split), each loaded by `beluga bench serve` (greedy, ignore_eos) at the given
# concurrencies. Every configuration gets the same cores: CORES threads for one rank, CORES / N a rank.
# usage: [BELUGA=build/beluga] [RANKS=2] [CORES=$(nproc)] [CONCURRENCIES="1 8"] [PROMPTS_PER_SLOT=4] \
#        [INPUT_LEN=128] [OUTPUT_LEN=64] [KV_MB=256] [MODEL=DIR] [LOAD=dummy] [TOKENIZER=DIR] \
#        [RESULTS=DIR] [SERVE_ARGS="..."] [CONFIGS="one ep2 dp2 tp2"] bench/parallel_cpu.sh
# SERVE_ARGS: more `beluga serve` flags for every configuration (e.g. --speculative-config '{...}').
# Prints a table of output tok/s per configuration and concurrency (and the ratio to one rank); each
# point's `bench serve --out` JSON stays in RESULTS (default: a temporary directory).
set -euo pipefail
BELUGA=${BELUGA:-build/beluga}
RANKS=${RANKS:-2}
CORES=${CORES:-$(nproc)}
CONCURRENCIES=${CONCURRENCIES:-"1 8"}
PROMPTS_PER_SLOT=${PROMPTS_PER_SLOT:-4}
INPUT_LEN=${INPUT_LEN:-128}
OUTPUT_LEN=${OUTPUT_LEN:-64}
KV_MB=${KV_MB:-256}
per_rank=$((CORES / RANKS))
[ "$per_rank" -ge 1 ] || per_rank=1
model_args=()
[ -n "${MODEL:-}" ] && model_args+=(--model "$MODEL")
[ -n "${LOAD:-}" ] && model_args+=(--load-format "$LOAD")
[ -n "${TOKENIZER:-}" ] && model_args+=(--tokenizer "$TOKENIZER")
# shellcheck source=bench/serve_lib.sh
source "$(dirname "$0")/serve_lib.sh"
log=$(mktemp)
results=${RESULTS:-$(mktemp -d)}
mkdir -p "$results"
trap 'rm -f "$log"; if [ -z "${RESULTS:-}" ]; then rm -rf "$results"; fi' EXIT
configs=${CONFIGS:-"one ep$RANKS dp$RANKS tp$RANKS"}
for cfg in $configs; do
  case $cfg in
    one) args=(--threads "$CORES") ;;
    ep*) args=(--threads "$per_rank" --expert-parallel-size "$RANKS") ;;
    dp*) args=(--threads "$per_rank" --data-parallel-size "$RANKS") ;;
    tp*) args=(--threads "$per_rank" --tensor-parallel-size "$RANKS") ;;
  esac
  # shellcheck disable=SC2086  # SERVE_ARGS is a list of flags
  eval "extra=(${SERVE_ARGS:-})"
  start_server "$log" "$BELUGA" serve --port 0 --kv-cache-mb "$KV_MB" "${model_args[@]}" "${args[@]}" "${extra[@]}"
  for c in $CONCURRENCIES; do
    # One short unmeasured run first (the first requests pay for page faults and warm-up).
    "$BELUGA" bench serve --url "http://127.0.0.1:$port" --num-prompts "$c" --max-concurrency "$c" \
      --input-len "$INPUT_LEN" --output-len 16 --seed 2 --request-extra '{"ignore_eos":true}' >/dev/null 2>&1 || true
    echo "== $cfg (${args[*]}), concurrency $c"
    "$BELUGA" bench serve --url "http://127.0.0.1:$port" --num-prompts $((c * PROMPTS_PER_SLOT)) \
      --max-concurrency "$c" --input-len "$INPUT_LEN" --output-len "$OUTPUT_LEN" --seed 1 \
      --request-extra '{"temperature":0,"ignore_eos":true}' --out "$results/${cfg}_c$c.json"
  done
  stop_server
done
python3 - "$results" "$configs" "$CONCURRENCIES" <<'PY'
import json, os, sys
d, configs, cs = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
def tps(cfg, c):
    f = os.path.join(d, f"{cfg}_c{c}.json")
    return json.load(open(f))["output_throughput"] if os.path.exists(f) else None
print("| configuration | " + " | ".join(f"c{c} output tok/s" for c in cs) + " |")
print("|---|" + "---|" * len(cs))
for cfg in configs:
    cells = []
    for c in cs:
        v, base = tps(cfg, c), tps("one", c)
        cells.append("-" if v is None else f"{v:.0f}" + (f" ({v / base:.2f}x)" if base and cfg != "one" else ""))
    print(f"| {cfg} | " + " | ".join(cells) + " |")
PY
