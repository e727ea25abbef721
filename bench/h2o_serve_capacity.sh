#!/usr/bin/env bash
# The H2O capacity claim through the service, one run: `deja serve` at TP 1 with a fixed KV memory
# (--kv-memory-mb, default 256; --wait-for-kv, so streams queue for memory), first with the full cache as the server default, then with
# h2o 20% of a 1024-token sequence (--heavy-tokens 102 --recent-tokens 103); each time STREAMS
# concurrent greedy streams of a 256-token prompt (held-out kjv) and 768 new tokens (1024-token
# sequences), driven by `deja client bench`. Prints one JSON line per policy: tokens/s, the most
# sequences running at once (polled from /metrics) and tokens per step (admission reserves the
# whole sequence for `full`; for h2o its budget plus its prompt while it prefills, then the
# budget).
#   bash bench/h2o_serve_capacity.sh [build/release/cli/deja] [model dir]
# Environment: STREAMS (default 308: two full waves of h2o at 256 MiB), KV_MB (default 256), MAX_NEW (default 768),
# SERVE_FLAGS (extra `deja serve` flags, e.g. "--kv-dtype f16").
set -euo pipefail
cd "$(dirname "$0")/.."
DEJA=${1:-build/release/cli/deja}
MODEL=${2:-models/opt-mini}
STREAMS=${STREAMS:-308}
KV_MB=${KV_MB:-256}
MAX_NEW=${MAX_NEW:-768}
PORT=${DEJA_BENCH_PORT:-50072}
METRICS_PORT=${DEJA_BENCH_METRICS_PORT:-9172}
# ~256 tokens of held-out text (the tokenizer makes ~4 characters a token here).
PROMPT=$(head -c 1000 tests/data/heldout/kjv.txt | tr '\n' ' ')
# shellcheck source=bench/serve_lib.sh
. bench/serve_lib.sh
for policy in "full" "h2o --heavy-tokens 102 --recent-tokens 103"; do
  # shellcheck disable=SC2086  # policy and SERVE_FLAGS are lists of flags
  start_deja_serve "$DEJA" $PORT /tmp/deja_h2o_serve_capacity.log --model "$MODEL" --tp 1 \
    --metrics-port $METRICS_PORT --http-port -1 --kv-memory-mb "$KV_MB" --max-batch-sequences 512 \
    --max-queue 1024 --wait-for-kv --step-timeout-ms 60000 --kv-policy $policy ${SERVE_FLAGS:-}
  echo "# policy=$policy kv_memory_mb=$KV_MB streams=$STREAMS flags=${SERVE_FLAGS:-}"
  # The most sequences running at once, from /metrics every 0.2 s while the bench runs.
  python3 - "$METRICS_PORT" >/tmp/deja_h2o_serve_capacity.peak <<'PY' &
import re, sys, time, urllib.request
peak = 0
url = "http://127.0.0.1:%s/metrics" % sys.argv[1]
end = time.time() + 3600
while time.time() < end:
    try:
        body = urllib.request.urlopen(url, timeout=2).read().decode()
    except Exception:
        break
    m = re.search(r"^deja_coordinator_running_requests (\S+)$", body, re.M)
    if m:
        peak = max(peak, int(float(m.group(1))))
        print(peak, flush=True)
    time.sleep(0.2)
PY
  POLL=$!
  "$DEJA" client bench --target 127.0.0.1:$PORT --metrics-target 127.0.0.1:$METRICS_PORT \
    --streams "$STREAMS" --max-new-tokens "$MAX_NEW" --prompt "$PROMPT" >/tmp/deja_h2o_serve_capacity.json
  kill $POLL 2>/dev/null || true
  wait $POLL 2>/dev/null || true
  PEAK=$(tail -1 /tmp/deja_h2o_serve_capacity.peak)
  tail -1 /tmp/deja_h2o_serve_capacity.json |
    sed "s/^{/{\"policy\":\"${policy%% *}\",\"peak_running_sequences\":${PEAK:-0},/"
  stop_deja_serve
done
