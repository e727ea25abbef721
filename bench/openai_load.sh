#!/usr/bin/env bash
# A load run with a real load tool: Locust (PyPI, installed into build/venv-locust here) drives
# 256 users, each streaming completions from the OpenAI-compatible API of a `deja serve` at TP 2
# one after another, for 2 minutes (bench/openai_locust.py). Prints Locust's own table and one
# `load_summary` JSON line: streams, failures (the target is 0), tokens/s, and the time to first
# token and inter-token latency percentiles.
#   bash bench/openai_load.sh [build/release/cli/deja] [model dir]
# Environment: USERS (256), RUN_SECONDS (120), DEJA_LOAD_MAX_TOKENS (64), SERVE_FLAGS.
set -euo pipefail
cd "$(dirname "$0")/.."
DEJA=${1:-build/release/cli/deja}
MODEL=${2:-models/opt-mini}
USERS=${USERS:-256}
PORT=${DEJA_BENCH_PORT:-50074}
HTTP_PORT=${DEJA_BENCH_HTTP_PORT:-8074}
VENV=build/venv-locust
if ! "$VENV/bin/python3" -c "import locust" 2>/dev/null; then
  python3 -m venv "$VENV" && "$VENV/bin/python3" -m pip install -q locust
fi
# shellcheck source=bench/serve_lib.sh
. bench/serve_lib.sh
# shellcheck disable=SC2086  # SERVE_FLAGS is a list of flags
start_deja_serve "$DEJA" $PORT /tmp/deja_openai_load.log --model "$MODEL" --tp 2 \
  --metrics-port -1 --http-port $HTTP_PORT --max-batch-sequences "$USERS" \
  --max-queue $((2 * USERS)) --step-timeout-ms 60000 ${SERVE_FLAGS:-}
echo "# model=$MODEL tp=2 users=$USERS seconds=${RUN_SECONDS:-120} $(date -u +%F) $(nproc) cores"
"$VENV/bin/locust" -f bench/openai_locust.py --headless --users "$USERS" \
  --spawn-rate "$USERS" --run-time "${RUN_SECONDS:-120}s" --host "http://127.0.0.1:$HTTP_PORT" \
  --only-summary --stop-timeout 60
stop_deja_serve
