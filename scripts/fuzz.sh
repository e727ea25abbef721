#!/usr/bin/env bash
# Builds the libFuzzer targets (the `fuzz` preset: clang, ASan, UBSan, build/fuzz) and runs each
# for SECONDS (default 60) on a scratch copy of its seed corpus (build/fuzz/fuzzing/corpus/<target>;
# the committed seeds in tests/fuzz/corpus are not modified). Prints each target's executions,
# executions per second and coverage (cov: edges, ft: features). Fails if any target crashes,
# leaks, runs out of time or memory on one input, or breaks one of its invariants; the input is
# kept under build/fuzz/fuzzing/crashes/<target>/ and the log in build/fuzz/fuzzing/<target>.log.
#
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]
#   targets: safetensors opt_config tokenizer request step api (default: all, one after another)
# Reproduce a crash: build/fuzz/tests/fuzz/fuzz_<target> <crash file>
set -euo pipefail
cd "$(dirname "$0")/.."

ALL=(safetensors opt_config tokenizer request step api)
seconds=${1:-60}
[ $# -gt 0 ] && shift
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [ "$seconds" -lt 1 ]; then
  echo "usage: scripts/fuzz.sh [SECONDS] [TARGET...]; targets: ${ALL[*]}" >&2
  exit 2
fi
targets=()
for t in "$@"; do
  t=${t#fuzz_}
  if [[ " ${ALL[*]} " != *" $t "* ]]; then
    echo "unknown target '$t'; targets: ${ALL[*]}" >&2
    exit 2
  fi
  targets+=("$t")
done
[ ${#targets[@]} -eq 0 ] && targets=("${ALL[@]}")

start=$(date +%s)
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz -j "$(nproc)"
echo "fuzz build: $(($(date +%s) - start)) s"

work=build/fuzz/fuzzing
mkdir -p "$work/tmp"
# The targets write their scratch files here rather than in /tmp.
export TMPDIR="$PWD/$work/tmp"
# Symbolized stack traces in reports (the llvm package installs llvm-symbolizer).
if [ -z "${ASAN_SYMBOLIZER_PATH:-}" ]; then
  for s in "$(command -v llvm-symbolizer || true)" /usr/lib/llvm-14/bin/llvm-symbolizer; do
    if [ -n "$s" ] && [ -x "$s" ]; then
      export ASAN_SYMBOLIZER_PATH="$s"
      break
    fi
  done
fi
export UBSAN_OPTIONS="print_stacktrace=1:${UBSAN_OPTIONS:-}"

failed=()
summary=()
for t in "${targets[@]}"; do
  corpus="$work/corpus/$t"
  crashes="$work/crashes/$t"
  log="$work/$t.log"
  rm -rf "$corpus"
  mkdir -p "$corpus" "$crashes"
  cp tests/fuzz/corpus/"$t"/* "$corpus"/
  args=("$corpus" -max_total_time="$seconds" -print_final_stats=1 -timeout=30
        -rss_limit_mb=2048 -malloc_limit_mb=1024 -artifact_prefix="$crashes/")
  [ -f "tests/fuzz/dict/$t.dict" ] && args+=(-dict="tests/fuzz/dict/$t.dict")
  echo "== fuzz_$t: ${seconds} s on $(ls "$corpus" | wc -l) seeds (log: $log)"
  rc=0
  "build/fuzz/tests/fuzz/fuzz_$t" "${args[@]}" >"$log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(grep -E '^#[0-9]+.*cov: ' "$log" | tail -1 | sed -E 's/.*cov: ([0-9]+) ft: ([0-9]+).*/\1 \2/')
  line=$(printf '%-12s execs %-10s exec/s %-7s cov %-6s ft %-6s corpus %s' "$t" "${execs:-?}" \
    "${rate:-?}" "${cov% *}" "${cov#* }" "$(ls "$corpus" | wc -l)")
  if [ "$rc" -ne 0 ]; then
    failed+=("$t")
    line+="  FAILED (exit $rc)"
    grep -E 'ERROR: |fuzz invariant violated|SUMMARY: |runtime error' "$log" | head -5 || true
    ls -t "$crashes" | head -1 | sed "s|^|   input: $crashes/|"
  fi
  echo "$line"
  summary+=("$line")
done

echo
echo "== fuzzing summary (${seconds} s per target)"
printf '%s\n' "${summary[@]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "FAILED: ${failed[*]} (inputs under $work/crashes/, logs $work/<target>.log)" >&2
  exit 1
fi
