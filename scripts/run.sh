#!/usr/bin/env bash
# The main job: install dependencies, build, and run deja on the bundled models/opt-mini.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/build.sh
exec ./build/release/cli/deja generate --model models/opt-mini \
  --prompt "${DEJA_PROMPT:-And God said unto Moses,}" --max-new-tokens "${DEJA_MAX_NEW_TOKENS:-64}" "$@"
