#!/usr/bin/env bash
# Opt-in soak (not part of CI): builds, then `deja serve --tp 2` on models/opt-mini under 200
# concurrent streams for 10 minutes with random sampling settings, cache policies and cancels;
# checks that no token is lost or duplicated (stream deltas == a unary replay, token counts ==
# generated_tokens), RSS growth < 5% after warm-up, and no fd or thread growth.
# Usage: scripts/soak.sh [--streams N] [--seconds S] [...] (tools/soak/run_soak.py --help)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/build.sh
exec python3 tools/soak/run_soak.py "$@"
