#!/usr/bin/env bash
# Configures and builds the release preset (build/release). Extra args go to the build step.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)" "$@"
