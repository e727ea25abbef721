#!/usr/bin/env bash
# The whole test suite on a fresh machine: install dependencies, build, run every test.
# GPU tests skip with a printed reason when no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/build.sh
ctest --preset release -j "$(nproc)" --timeout 900 "$@"
