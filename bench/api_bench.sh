#!/usr/bin/env bash
# The APIs against each other, one run: `deja serve` (TP 2) and the same streaming workload
# through deja.v1 gRPC and the OpenAI-compatible HTTP API (server-sent events) at 1, 64 and 256
# concurrent streams, two rounds per level with the order swapped (`deja client bench
# --http-target`). One JSON line per level: tokens/s, TTFT and inter-token percentiles per API,
# and HTTP's ratios to gRPC (targets: tokens/s >= 0.95x, p99 inter-token <= 1.1x).
#   bash bench/api_bench.sh [build/release/cli/deja] [model dir] [max new tokens]
# Environment: STREAMS (default 1,64,256), ROUNDS (default 2), SERVE_FLAGS.
set -euo pipefail
cd "$(dirname "$0")/.."
DEJA=${1:-build/release/cli/deja}
MODEL=${2:-models/opt-mini}
MAX_NEW=${3:-64}
PORT=${DEJA_BENCH_PORT:-50073}
HTTP_PORT=${DEJA_BENCH_HTTP_PORT:-8073}
# shellcheck source=bench/serve_lib.sh
. bench/serve_lib.sh
# shellcheck disable=SC2086  # SERVE_FLAGS is a list of flags
start_deja_serve "$DEJA" $PORT /tmp/deja_api_bench.log --model "$MODEL" --tp 2 \
  --metrics-port -1 --http-port $HTTP_PORT --max-batch-sequences 256 --max-queue 1024 \
  --step-timeout-ms 60000 ${SERVE_FLAGS:-}
echo "# model=$MODEL tp=2 max_new_tokens=$MAX_NEW flags=${SERVE_FLAGS:-} $(date -u +%F) $(nproc) cores"
"$DEJA" client bench --target 127.0.0.1:$PORT --http-target 127.0.0.1:$HTTP_PORT \
  --streams "${STREAMS:-1,64,256}" --rounds "${ROUNDS:-2}" --max-new-tokens "$MAX_NEW"
stop_deja_serve
