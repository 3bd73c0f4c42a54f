#!/usr/bin/env bash
# Speculative decoding with a host KV tier (docs/speculative-decoding.md, "With KV tiers"): the demo
# model on the CPU, its device pool (BLOCKS) too small for the prompts' shared prefixes (PREFIXES of
# PREFIX_LEN tokens, each request one of them at random plus 64 tokens of its own). Four servers: without / with MTP K=2 (fixed gating, so
# every decode step verifies drafts and publishes blocks after verification), each without / with
# --kv-host-gb. Per server: bench serve's prefix-cache hit rate, TTFT p50, output tok/s, and the
# server's host-tier hits and speculation counters from /metrics.
# usage: [BELUGA=build/beluga] [OUT_DIR=bench/results/spec_tier] [BLOCKS=20] [MAX_LEN=1024] [PREFIXES=16] [PREFIX_LEN=256] [PROMPTS=64]
#        [OUTPUT_LEN=48] [THREADS=1] bench/spec_tier_cpu.sh
set -euo pipefail
BELUGA=${BELUGA:-build/beluga}
OUT_DIR=${OUT_DIR:-bench/results/spec_tier}
BLOCKS=${BLOCKS:-20}
MAX_LEN=${MAX_LEN:-1024}
PREFIXES=${PREFIXES:-16}
PREFIX_LEN=${PREFIX_LEN:-256}
PROMPTS=${PROMPTS:-64}
OUTPUT_LEN=${OUTPUT_LEN:-48}
THREADS=${THREADS:-1}
mkdir -p "$OUT_DIR"
source "$(dirname "$0")/serve_lib.sh"
logs=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$logs"' EXIT
spec='{"method":"mtp","num_speculative_tokens":2,"gating":"fixed"}'
metric() {  # name-prefix: the sum of the samples whose name starts with it
  curl -s "http://127.0.0.1:$port/metrics" | awk -v m="$1" 'index($0, m) == 1 { s += $NF } END { print s + 0 }'
}
printf '%-14s %9s %9s %11s %12s %11s %9s\n' setting "hit %" "TTFT p50" "out tok/s" "host hits" "drafts" accepted
for s in plain spec plain+tier spec+tier; do
  args=(serve --model models/beluga-demo-coder-mtp --threads "$THREADS" --num-kv-blocks "$BLOCKS" --max-model-len "$MAX_LEN" --no-access-log --port 0)
  case $s in spec*) args+=(--speculative-config "$spec") ;; esac
  case $s in *tier) args+=(--kv-host-gb 0.5) ;; esac
  start_server "$logs/$s" "$BELUGA" "${args[@]}"
  "$BELUGA" bench serve --url "http://127.0.0.1:$port" --dataset shared-prefix --num-prompts "$PROMPTS" \
    --num-prefixes "$PREFIXES" --prefix-len "$PREFIX_LEN" --input-len 64 --max-concurrency 2 --output-len "$OUTPUT_LEN" --seed 0 \
    --request-extra '{"temperature":0,"ignore_eos":true}' --out "$OUT_DIR/$s.json" >"$logs/$s.bench" 2>&1
  hit=$(grep "Prefix cache hit rate" "$logs/$s.bench" | awk '{print $NF}')
  ttft=$(grep -m1 '^TTFT' "$logs/$s.bench" | awk '{print $5}')
  tps=$(grep "Output token throughput" "$logs/$s.bench" | awk '{print $NF}')
  printf '%-14s %9s %9s %11s %12s %11s %9s\n' "$s" "$hit" "$ttft" "$tps" \
    "$(metric 'beluga_kv_hit_tokens_total{model_name="beluga-demo-coder-mtp",tier="host"')" \
    "$(metric beluga_spec_decode_num_draft_tokens_total)" "$(metric beluga_spec_decode_num_accepted_tokens_total)"
  stop_server
done
