#!/usr/bin/env bash
# Issue #25's table: one `beluga serve` per setting (V2-Lite shape, dummy weights, on the GPU), loaded by
# `beluga bench serve` at fixed concurrencies (request rate inf) and at Poisson rates, with random
# 1024 -> 256 prompts and a shared-prefix set; one row per point: throughput, TTFT p50/p99, TPOT p50,
# per-token ITL p99 (and p99.9, max), goodput at TTFT <= 2 s and TPOT <= 50 ms. JSON per point in $OUT_DIR, the table in
# $OUT_DIR/table.md.
# usage: [BELUGA=build/beluga] [MODEL=bench/configs/deepseek-v2-lite] [TOKENIZER=models/beluga-demo-coder-mtp]
#        [CONCURRENCIES="16 64 128 256"] [RATES="8 16 32"] [SETTINGS="default"] [OUT_DIR=bench/results/sweep]
#        bench/serve_sweep_gpu.sh
# SETTINGS: space-separated names; "default" (no extra flags) and "policy" (--itl-target-ms 25
# --ttft-slo-ms 2000) are known.
set -euo pipefail
BELUGA=${BELUGA:-build/beluga}
MODEL=${MODEL:-bench/configs/deepseek-v2-lite}
TOKENIZER=${TOKENIZER:-models/beluga-demo-coder-mtp}
CONCURRENCIES=${CONCURRENCIES:-16 64 128 256}
RATES=${RATES:-8 16 32}
SETTINGS=${SETTINGS:-default}
OUT_DIR=${OUT_DIR:-bench/results/sweep}
KV_MB=${KV_MB:-32768}
mkdir -p "$OUT_DIR"
logs=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$logs"' EXIT
SLO="ttft_ms=2000,tpot_ms=50"

for setting in $SETTINGS; do
  extra=()
  case "$setting" in
    default) ;;
    policy) extra=(--itl-target-ms 25 --ttft-slo-ms 2000) ;;
    *) echo "unknown setting $setting" >&2; exit 2 ;;
  esac
  "$BELUGA" serve --device cuda --model "$MODEL" --load-format dummy --tokenizer "$TOKENIZER" \
    --kv-cache-mb "$KV_MB" --max-num-seqs 256 --no-access-log --port 0 "${extra[@]}" >"$logs/serve-$setting" 2>&1 &
  pid=$!
  port=
  for _ in $(seq 1800); do
    port=$(grep "serving " "$logs/serve-$setting" | sed -n 's/.*http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' | head -1 || true)
    [ -n "$port" ] && break
    kill -0 "$pid" 2>/dev/null || break  # it exited: say why at once rather than after 180 s
    sleep 0.1
  done
  [ -n "$port" ] || { cat "$logs/serve-$setting"; exit 1; }
  point() {  # name, bench serve args...
    local name=$1
    shift
    echo "== $setting $name"
    "$BELUGA" bench serve --url "http://127.0.0.1:$port" --seed 0 --slo "$SLO" --out "$OUT_DIR/$setting-$name.json" "$@" \
      2>&1 | grep -E "Failed|Output token|TTFT|TPOT|ITL |goodput" || true
  }
  # warm-up (graphs, allocator) so the first point is not the first request
  point warmup --dataset random --num-prompts 32 --input-len 1024 --output-len 16 --max-concurrency 32
  for c in $CONCURRENCIES; do
    point "random-c$c" --dataset random --num-prompts $((c * 3)) --input-len 1024 --output-len 256 --max-concurrency "$c"
  done
  for r in $RATES; do
    point "random-r$r" --dataset random --num-prompts 192 --input-len 1024 --output-len 256 --request-rate "$r" \
      --max-concurrency 256
  done
  point "shared-c64" --dataset shared-prefix --num-prompts 192 --prefix-len 768 --input-len 256 --output-len 256 \
    --max-concurrency 64
  point "shared-r16" --dataset shared-prefix --num-prompts 192 --prefix-len 768 --input-len 256 --output-len 256 \
    --request-rate 16 --max-concurrency 256
  kill "$pid"; wait "$pid" 2>/dev/null || true
  pid=
done

python3 - "$OUT_DIR" <<'EOF'
import json, glob, os, sys
d = sys.argv[1]
rows = ["| setting | point | ok / failed | out tok/s | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | ITL p99 ms (per token) | ITL p99 / TPOT p50 | ITL p99.9 / max ms | goodput req/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|"]
for f in sorted(glob.glob(os.path.join(d, "*.json"))):
    name = os.path.basename(f)[:-5]
    if name.endswith("warmup"): continue
    j = json.load(open(f))
    setting, point = name.split("-", 1)
    tp = j["tpot"]["p50_ms"]; ip = j["itl"]["p99_ms"]
    rows.append(f"| {setting} | {point} | {j['completed']} / {j['failed']} | {j['output_throughput']:.0f} | "
                f"{j['ttft']['p50_ms']:.0f} | {j['ttft']['p99_ms']:.0f} | {tp:.2f} | {ip:.2f} | "
                f"{ip / tp if tp else 0:.2f} | {j['itl'].get('p99_9_ms', 0):.1f} / {j['itl'].get('max_ms', 0):.1f} | "
                f"{j['goodput'] or 0:.2f} |")
open(os.path.join(d, "table.md"), "w").write("\n".join(rows) + "\n")
print("\n".join(rows))
EOF
