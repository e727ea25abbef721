#!/usr/bin/env bash
# Serving throughput and overhead, one run: starts `deja serve` on a model at TP 1 and TP 2,
# drives 1, 8 and 32 concurrent greedy streams with `deja client bench`, and prints one JSON
# line per level: tokens/s (and the speedup over one stream), median time to first token, the
# coordinator + RPC overhead as a fraction of the step, and the all-reduce share of rank 0's
# step (both from the server's /metrics over the same interval).
#   bash bench/serve_bench.sh [build/release/cli/deja] [model dir] [max new tokens]
# Environment: TPS (default "1 2"), SERVE_FLAGS (extra `deja serve` flags, e.g.
# "--dtype bf16 --kv-dtype f16").
# For the 1.3B shape: python3 tools/checkpoints/make_random_opt.py --shape 1.3b --out DIR first.
set -euo pipefail
cd "$(dirname "$0")/.."
DEJA=${1:-build/release/cli/deja}
MODEL=${2:-models/opt-mini}
MAX_NEW=${3:-64}
PORT=${DEJA_BENCH_PORT:-50071}
METRICS_PORT=${DEJA_BENCH_METRICS_PORT:-9171}
# shellcheck source=bench/serve_lib.sh
. bench/serve_lib.sh
for tp in ${TPS:-1 2}; do
  # shellcheck disable=SC2086  # SERVE_FLAGS is a list of flags
  start_deja_serve "$DEJA" $PORT /tmp/deja_serve_bench_$tp.log --model "$MODEL" --tp $tp \
    --metrics-port $METRICS_PORT --http-port -1 --max-batch-sequences 32 --step-timeout-ms 60000 \
    ${SERVE_FLAGS:-}
  echo "# tp=$tp model=$MODEL flags=${SERVE_FLAGS:-}"
  "$DEJA" client bench --target 127.0.0.1:$PORT --metrics-target 127.0.0.1:$METRICS_PORT \
    --streams 1,8,32 --max-new-tokens "$MAX_NEW" | sed "s/^{/{\"tp\":$tp,/"
  stop_deja_serve
done
