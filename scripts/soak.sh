#!/usr/bin/env bash
# Opt-in soak (not part of CI): builds, then `deja serve --tp 2` on models/opt-mini under 200
# concurrent streams for 10 minutes with random sampling settings, cache policies and cancels;
# checks that no token is lost or duplicated (stream deltas == a unary replay, token counts ==
# generated_tokens), RSS growth < 5% after warm-up, and no fd or thread growth.
# Usage: scripts/soak.sh [--streams N] [--seconds S] [...] (tools/soak/run_soak.py --help)
#
# scripts/soak.sh --differential [SECONDS]: the differential test (tests/serving/
# differential_test.cc) for SECONDS (default 1800): rounds of random concurrent requests on a
# loaded `deja serve --tp 2`, each answer held to the same request alone on a second server, and
# the loaded server's resident memory at most 5% over its size after the first round.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/build.sh
if [ "${1:-}" = --differential ]; then
  export DEJA_DIFFERENTIAL_SECONDS=${2:-1800} DEJA_SOURCE_DIR=$PWD
  exec build/release/tests/serving/differential_test
fi
exec python3 tools/soak/run_soak.py "$@"
