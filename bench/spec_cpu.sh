#!/usr/bin/env bash
# Speculative decoding on the CPU: the built-in demo model served without speculation and with MTP
# K=1, 2, each loaded by `beluga bench serve` (greedy unless REQUEST_EXTRA says otherwise, ignore_eos)
# at the given concurrencies.
# usage: [BELUGA=build/beluga] [CONCURRENCIES="1 4"] [PROMPTS_PER_SLOT=4] [OUTPUT_LEN=64] [THREADS=1] \
#        [SPECS="none 1 2"] [DEVICE=cuda] [REQUEST_EXTRA='{"temperature":0.8,"seed":1}'] \
#        [MODEL=DIR] [LOAD=dummy] [TOKENIZER=DIR] [KV_MB=256] [SYNTHETIC=P] [INPUT_LEN=64] bench/spec_cpu.sh
# MODEL/LOAD/TOKENIZER: serve another model (default the built-in demo); SYNTHETIC=P adds
# "synthetic_acceptance": P to every speculative config (benchmarks only: drafts accepted with probability P).
# KEEP_LOGS=DIR keeps each server's log there (with BELUGA_LOG_LEVEL=debug: the gate's costs and choices).
# WARMUP=1 (default; 0: off): before the measured points, each server serves one short unmeasured run per
# concurrency (c prompts, 96 tokens), so the CUDA graphs of its shapes are recorded and the gate has
# probed both regimes before anything is timed (a cold server pays both inside its first requests).
# TRACE_DIR=DIR: each server writes BELUGA_TRACE=DIR/<spec>.trace.json, summarised at its end
# (scripts/trace_summary.py: host time per step, the runner's gaps, a speculating step's phases).
# RANGE=R: each request's input and output lengths uniform in [len (1 - R), len (1 + R)] (bench serve
# --random-range-ratio), so a closed loop's requests do not end together.
# RATE=R: Poisson arrivals at R requests/s (bench serve --request-rate; the concurrency still caps
# them), so requests do not start and end in lockstep as a closed loop of equal outputs makes them.
# DEVICE: serve --device, default cpu. REQUEST_EXTRA: bench serve --request-extra, merged into every
# request (sampled requests speculate through rejection sampling; default {}: greedy).
# SPECS entries: none, K (confidence-gated, the default gating), K/cost (one depth for the batch) or
# K/fixed (always K drafts); ngramK or ngramK/fixed: prompt lookup instead of MTP (prompt_lookup_max 3, prompt_lookup_min 1).
# ROUNDS=N (default 1): the whole list of servers N times over, alternated (short closed-loop points
# move 5-20 % between runs of one binary); at the end a table of each (spec, concurrency)'s median
# output tok/s over the rounds and its ratio to "none" (when listed). RESULTS=DIR keeps each point's
# `bench serve --out` JSON there (default: a temporary directory).
set -euo pipefail
BELUGA=${BELUGA:-build/beluga}
CONCURRENCIES=${CONCURRENCIES:-"1 4"}
PROMPTS_PER_SLOT=${PROMPTS_PER_SLOT:-4}
OUTPUT_LEN=${OUTPUT_LEN:-64}
THREADS=${THREADS:-1}
SPECS=${SPECS:-"none 1 2"}
KV_MB=${KV_MB:-256}
INPUT_LEN=${INPUT_LEN:-64}
model_args=()
[ -n "${MODEL:-}" ] && model_args+=(--model "$MODEL")
[ -n "${LOAD:-}" ] && model_args+=(--load-format "$LOAD")
[ -n "${TOKENIZER:-}" ] && model_args+=(--tokenizer "$TOKENIZER")
synthetic=
[ -n "${SYNTHETIC:-}" ] && synthetic=",\"synthetic_acceptance\":$SYNTHETIC"
REQUEST_EXTRA=${REQUEST_EXTRA:-"{}"}
log=$(mktemp)
results=${RESULTS:-$(mktemp -d)}
mkdir -p "$results"
trap 'rm -f "$log"; if [ -z "${RESULTS:-}" ]; then rm -rf "$results"; fi' EXIT
for round in $(seq "${ROUNDS:-1}"); do
for spec in $SPECS; do
  extra=()
  if [ "$spec" != none ]; then
    k=${spec%%/*} gating=confidence method=mtp lookup=
    [ "$spec" != "$k" ] && gating=${spec#*/}
    if [ "${k#ngram}" != "$k" ]; then
      k=${k#ngram} method=ngram lookup=',"prompt_lookup_min":1,"prompt_lookup_max":3'
    fi
    extra=(--speculative-config "{\"method\":\"$method\",\"num_speculative_tokens\":$k,\"gating\":\"$gating\"$lookup$synthetic}")
  fi
  trace=
  [ -n "${TRACE_DIR:-}" ] && trace="$TRACE_DIR/${spec//\//_}.trace.json"
  BELUGA_TRACE=$trace "$BELUGA" serve --port 0 --threads "$THREADS" --kv-cache-mb "$KV_MB" --device "${DEVICE:-cpu}" "${model_args[@]}" "${extra[@]}" >"$log" 2>&1 &
  pid=$!
  port=
  for _ in $(seq 600); do
    port=$(sed -n 's/.*serving .* on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$log")
    [ -n "$port" ] && break
    kill -0 "$pid" 2>/dev/null || break  # it exited: say why at once
    sleep 0.1
  done
  [ -n "$port" ] || { cat "$log"; kill "$pid"; exit 1; }
  if [ "${WARMUP:-1}" != 0 ]; then
    for c in $CONCURRENCIES; do
      "$BELUGA" bench serve --url "http://127.0.0.1:$port" --num-prompts "$c" --max-concurrency "$c" \
        --input-len "$INPUT_LEN" --output-len 96 --seed 2 --request-extra "$REQUEST_EXTRA" >/dev/null 2>&1 || true
    done
  fi
  for c in $CONCURRENCIES; do
    echo "== speculative K=$spec, concurrency $c"
    "$BELUGA" bench serve --url "http://127.0.0.1:$port" --num-prompts $((c * PROMPTS_PER_SLOT)) \
      --max-concurrency "$c" --input-len "$INPUT_LEN" --output-len "$OUTPUT_LEN" --seed 1 --request-extra "$REQUEST_EXTRA" \
      ${RATE:+--request-rate "$RATE"} ${RANGE:+--random-range-ratio "$RANGE"} \
      --out "$results/${spec//\//_}_c${c}_r${round}.json"
  done
  curl -s "http://127.0.0.1:$port/metrics" | grep -E '^beluga_spec_decode|^beluga_engine_steps' || true
  kill "$pid"
  wait "$pid" || true
  if [ -n "${KEEP_LOGS:-}" ]; then cp "$log" "$KEEP_LOGS/serve_${spec//\//_}.log"; fi
  if [ -n "$trace" ]; then python3 "$(dirname "$0")/../scripts/trace_summary.py" "$trace" --skip-first 8 || true; fi
done
done
python3 - "$results" "$SPECS" "$CONCURRENCIES" <<'EOF'
import glob, json, os, statistics, sys
d, specs, cs = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
def median(spec, c):
    v = [json.load(open(f))["output_throughput"]
         for f in glob.glob(os.path.join(d, f"{spec.replace('/', '_')}_c{c}_r*.json"))]
    return (statistics.median(v), len(v)) if v else (None, 0)
print("| spec | " + " | ".join(f"c{c} tok/s (median of n)" for c in cs) + " |")
print("|---|" + "---|" * len(cs))
for spec in specs:
    cells = []
    for c in cs:
        m, n = median(spec, c)
        base = median("none", c)[0] if "none" in specs and spec != "none" else None
        cells.append("-" if m is None else f"{m:.0f} (n={n})" + (f", {m / base:.2f}x" if base else ""))
    print(f"| {spec} | " + " | ".join(cells) + " |")
EOF
