#!/usr/bin/env bash
# Runs the libFuzzer targets of tests/fuzz, one after the other (one process each: the machine's
# cores are shared), and prints per target the executions and the crashes found.
#
#   scripts/fuzz.sh [--time S | --runs N] [--seed K] [--build DIR] [target...]
#
# --time S   seconds per target (default 60); --runs N: N inputs per target instead.
# --seed K   libFuzzer's random seed: with --runs, a run from a fresh build tree is reproducible
#            (what CI uses, so that its verdict does not depend on the machine's speed).
# targets    names without the fuzz_ prefix (chat_request, jinja, ...); default: all of them.
# Each target starts from its seed corpus (tests/fuzz/corpus/<target>, read-only) plus what earlier
# runs found (DIR/corpus/<target>); crashing inputs land in DIR/artifacts/<target>/. Exit status 1
# when any target crashed, timed out, leaked or ran out of memory.
set -euo pipefail
cd "$(dirname "$0")/.."

TIME=60
RUNS=""
SEED=""
BUILD=build-asan
TARGETS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --time) TIME="$2"; RUNS=""; shift 2 ;;
    --runs) RUNS="$2"; shift 2 ;;
    --seed) SEED="$2"; shift 2 ;;
    --build) BUILD="$2"; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) TARGETS+=("$1"); shift ;;
  esac
done

bash scripts/sanitizer-tree.sh "$BUILD"
cmake --build "$BUILD" -j "${JOBS:-$(nproc)}" --target fuzz_all

if [ ${#TARGETS[@]} -eq 0 ]; then
  for f in tests/fuzz/fuzz_*.cc; do n=$(basename "$f" .cc); TARGETS+=("${n#fuzz_}"); done
fi

failed=0
results=()
for t in "${TARGETS[@]}"; do
  bin="$BUILD/fuzz_$t"
  [ -x "$bin" ] || { echo "fuzz: no target $t" >&2; exit 2; }
  work="$BUILD/corpus/$t" art="$BUILD/artifacts/$t"
  mkdir -p "$work" "$art"
  seeds=()
  [ -d "tests/fuzz/corpus/$t" ] && seeds=("tests/fuzz/corpus/$t")
  dict=()
  if [ -f "tests/fuzz/dict/$t.dict" ]; then dict=("-dict=tests/fuzz/dict/$t.dict")
  elif [ "${t%_request}" != "$t" ]; then dict=("-dict=tests/fuzz/dict/request.dict"); fi
  if [ -n "$RUNS" ]; then limit=("-runs=$RUNS"); else limit=("-max_total_time=$TIME"); fi
  [ -z "$SEED" ] || limit+=("-seed=$SEED")
  log="$BUILD/fuzz-$t.log"
  before=$(find "$art" -type f | wc -l)
  set +e
  "$bin" "${limit[@]}" "${dict[@]}" -timeout=10 -rss_limit_mb=2048 -max_len=16384 -print_final_stats=1 \
    -artifact_prefix="$art/" "$work" "${seeds[@]}" >"$log" 2>&1
  rc=$?
  set -e
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  [ -n "$execs" ] || execs=$(grep -oE '^#[0-9]+' "$log" | tail -1 | tr -d '#')
  crashes=$(( $(find "$art" -type f | wc -l) - before ))
  status=ok
  if [ "$rc" -ne 0 ] || [ "$crashes" -gt 0 ]; then
    status="FAILED (exit $rc; see $log)"
    failed=1
    [ "$crashes" -gt 0 ] || crashes=1
  fi
  results+=("$(printf '%-22s %14s %8s  %s' "$t" "${execs:-0}" "$crashes" "$status")")
  echo "${results[-1]}"
done

echo
printf '%-22s %14s %8s  %s\n' target executions crashes status
printf '%s\n' "${results[@]}"
exit $failed
