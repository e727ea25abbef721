#!/usr/bin/env bash
# The whole test suite on a fresh machine: install dependencies, build, run every test, then
# every fuzz target for DEJA_FUZZ_SECONDS (default 60; 0 skips fuzzing) with scripts/fuzz.sh.
# GPU tests skip with a printed reason when no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/build.sh
ctest --preset release -j "$(nproc)" --timeout 900 "$@"
fuzz_seconds=${DEJA_FUZZ_SECONDS:-60}
if [ "$fuzz_seconds" != 0 ]; then
  bash scripts/fuzz.sh "$fuzz_seconds"
fi
