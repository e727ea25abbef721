#!/usr/bin/env bash
# Opt-in (not part of CI): builds the asan (AddressSanitizer + UndefinedBehaviorSanitizer) or
# tsan (ThreadSanitizer) preset and runs the unit and integration tests under it; any report
# fails the run. Usage: scripts/sanitize.sh asan|tsan [ctest args...]
#   scripts/sanitize.sh asan                 # everything
#   scripts/sanitize.sh tsan -R 'Engine|Serving'
# On this 2-core machine each preset takes about half an hour to build. Kernel and model
# tests that only repeat the release run's arithmetic are skipped under TSan (-E below) to keep
# it within an hour; the threaded parts (coordinator, engine, worker service, communicators,
# serving) all run.
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${1:-}
case "$preset" in
  asan | tsan) shift ;;
  *) echo "usage: $0 asan|tsan [ctest args...]" >&2; exit 2 ;;
esac
bash scripts/install_deps.sh
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" -j "$(nproc)"
# Reports are errors: halt_on_error turns each into a failing test with its report in the log.
export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:abort_on_error=1:detect_stack_use_after_return=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1"
extra=()
if [ "$preset" = tsan ]; then
  extra=(-E 'Golden|Bf16|CompareAttention|CompareMatmul|TopK|Perplexity')
fi
ctest --preset "$preset" -j "$(nproc)" --timeout 1800 "${extra[@]}" "$@"
