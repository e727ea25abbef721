#!/usr/bin/env bash
# Paged KV memory through the service, one run: `deja serve` at TP 1 with a fixed KV memory
# (--kv-memory-mb, default 16; --wait-for-kv, so streams queue for memory), first with
# --kv-paging off (each sequence reserves prompt + max_new_tokens when admitted), then on (a
# block pool: a sequence holds the blocks it has used, admission counts them plus one free block
# per sequence, and the newest sequence is preempted and recomputed when blocks run out). Each
# time STREAMS concurrent greedy full-cache streams of a short held-out prompt ask for MAX_NEW
# tokens and stop after STOP_AFTER (the client cancels them, as a stop sequence would end them).
# Prints one JSON line per mode: the most sequences running at once (polled from /metrics),
# tokens/s, preemptions; then the ratio of the peaks.
#   bash bench/paged_kv_capacity.sh [build/release/cli/deja] [model dir]
# Environment: STREAMS (default 96), KV_MB (default 16), MAX_NEW (default 256), STOP_AFTER
# (default 64), SERVE_FLAGS (extra `deja serve` flags).
set -euo pipefail
cd "$(dirname "$0")/.."
DEJA=${1:-build/release/cli/deja}
MODEL=${2:-models/opt-mini}
STREAMS=${STREAMS:-96}
KV_MB=${KV_MB:-16}
MAX_NEW=${MAX_NEW:-256}
STOP_AFTER=${STOP_AFTER:-64}
PORT=${DEJA_BENCH_PORT:-50073}
METRICS_PORT=${DEJA_BENCH_METRICS_PORT:-9173}
# ~32 tokens of held-out text.
PROMPT=$(head -c 130 tests/data/heldout/kjv.txt | tr '\n' ' ')
# shellcheck source=bench/serve_lib.sh
. bench/serve_lib.sh
OUT=/tmp/deja_paged_kv_capacity
for paging in off on; do
  # shellcheck disable=SC2086  # SERVE_FLAGS is a list of flags
  start_deja_serve "$DEJA" $PORT $OUT.$paging.log --model "$MODEL" --tp 1 \
    --metrics-port $METRICS_PORT --http-port -1 --kv-memory-mb "$KV_MB" --max-batch-sequences 512 \
    --max-queue 1024 --wait-for-kv --step-timeout-ms 60000 --kv-paging $paging ${SERVE_FLAGS:-}
  # The most sequences running at once, from /metrics every 0.1 s while the bench runs.
  python3 - "$METRICS_PORT" >$OUT.$paging.peak <<'PY' &
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
    p = re.search(r"^deja_coordinator_preemptions_total (\S+)$", body, re.M)
    if m:
        peak = max(peak, int(float(m.group(1))))
        print(peak, int(float(p.group(1))) if p else 0, flush=True)
    time.sleep(0.1)
PY
  POLL=$!
  "$DEJA" client bench --target 127.0.0.1:$PORT --metrics-target 127.0.0.1:$METRICS_PORT \
    --streams "$STREAMS" --max-new-tokens "$MAX_NEW" --stop-after "$STOP_AFTER" \
    --prompt "$PROMPT" >$OUT.$paging.json
  sleep 0.3
  kill $POLL 2>/dev/null || true
  wait $POLL 2>/dev/null || true
  read -r PEAK PREEMPTED < <(tail -1 $OUT.$paging.peak)
  eval "PEAK_${paging}=${PEAK:-0}"
  tail -1 $OUT.$paging.json | sed "s/^{/{\"kv_paging\":\"$paging\",\"kv_memory_mb\":$KV_MB,\"peak_running_sequences\":${PEAK:-0},\"preemptions\":${PREEMPTED:-0},/"
  stop_deja_serve
done
python3 -c "import sys; on, off = int(sys.argv[1]), int(sys.argv[2]); print('{\"peak_running_paged_over_unpaged\": %.2f}' % (on / max(off, 1)))" \
  "$PEAK_on" "$PEAK_off"
