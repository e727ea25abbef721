#!/usr/bin/env bash
# The whole test suite on a fresh machine: install dependencies, build, run every test (the fuzz
# targets among them, replayed over their seeds and random mutants: ctest fuzz_replay_*).
# DEJA_FUZZ_SECONDS=N then also builds the libFuzzer targets with the sanitizers and fuzzes each
# for N seconds (scripts/fuzz.sh; opt-in: the sanitizer build alone takes 6 to 15 minutes on two
# cores). GPU tests skip with a printed reason when no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/build.sh
ctest --preset release -j "$(nproc)" --timeout 900 "$@"
fuzz_seconds=${DEJA_FUZZ_SECONDS:-0}
if [ "$fuzz_seconds" != 0 ]; then
  bash scripts/fuzz.sh "$fuzz_seconds"
fi
