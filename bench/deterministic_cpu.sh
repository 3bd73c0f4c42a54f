#!/usr/bin/env bash
# The cost of --deterministic on the CPU: `beluga bench model` with and without it, alternated over
# ROUNDS rounds on the same machine (batch 1 and 8), best of the rounds per mode (the machine is shared,
# so the best run is the least disturbed one). Usage: bench/deterministic_cpu.sh [BUILD_DIR] [OUT_DIR]
# Env: MODEL (a model directory or config.json; default the built-in model), LOAD_FORMAT (e.g. dummy),
# ROUNDS (5), THREADS (2), PROMPT_LEN (256), GEN_LEN (32).
set -euo pipefail
build=${1:-build}
out=${2:-$(mktemp -d)}
rounds=${ROUNDS:-5}
mkdir -p "$out"
for round in $(seq 1 "$rounds"); do
  for mode in off on; do
    flag=()
    [ -n "${MODEL:-}" ] && flag+=(--model "$MODEL")
    [ -n "${LOAD_FORMAT:-}" ] && flag+=(--load-format "$LOAD_FORMAT")
    [ "$mode" = on ] && flag+=(--deterministic)
    for b in 1 8; do
      "$build/beluga" bench model --batch "$b" --prompt-len "${PROMPT_LEN:-256}" --gen-len "${GEN_LEN:-32}" --threads "${THREADS:-2}" \
        "${flag[@]}" --out "$out/r${round}_${mode}_b$b.json" > /dev/null
    done
  done
done
python3 - "$out" <<'PY'
import glob, json, sys
best = {}
for f in glob.glob(sys.argv[1] + "/r*.json"):
    j = json.load(open(f))
    k = (j["batch"], j["deterministic"])
    b = best.setdefault(k, {"prefill": 0.0, "decode_p50": 1e9, "runs": 0})
    b["prefill"] = max(b["prefill"], j["prefill_tokens_per_s"])
    b["decode_p50"] = min(b["decode_p50"], j["decode_ms_per_step_p50"])
    b["runs"] += 1
print(f"{'batch':>5} {'mode':>13} {'runs':>4} | {'prefill tok/s':>13} {'decode p50 ms':>13} {'decode tok/s':>12}")
for (batch, det), b in sorted(best.items()):
    print(f"{batch:>5} {'deterministic' if det else 'default':>13} {b['runs']:>4} | {b['prefill']:>13.1f} "
          f"{b['decode_p50']:>13.2f} {batch * 1000 / b['decode_p50']:>12.1f}")
for batch in sorted({k[0] for k in best}):
    off, on = best[(batch, False)], best[(batch, True)]
    print(f"batch {batch}: deterministic prefill {on['prefill'] / off['prefill']:.2f}x, "
          f"decode step {on['decode_p50'] / off['decode_p50']:.2f}x the default's")
PY
