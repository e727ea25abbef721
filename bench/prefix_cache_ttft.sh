#!/usr/bin/env bash
# Time to first token with the prefix cache, one run: `deja serve` at TP 1 on the OPT-1.3B
# shape, a ~1,000-token shared document (held-out kjv text) and QUESTIONS 32-token questions
# (held-out war_and_peace text), each asked alone (max_new_tokens 1). Modes:
#   recompute  every request computes its whole prompt (PrefixCache.MODE_OFF)
#   memory     the document is in the workers' memory tier (a first request left it there)
#   host       before each question a request with another ~1,000-token document pushes the
#              first one out of the memory tier (which holds one document) into host memory
#   disk       as host, with no host tier: the blocks come back from the disk tier's files
# Prints one JSON line per mode (median and each TTFT in ms, cached prompt tokens) and the
# ratios against recompute.
#   bash bench/prefix_cache_ttft.sh [build/release/cli/deja] [model dir]
# Environment: QUESTIONS (default 16), MEMORY_MB (memory tier, default 256: one document of the
# 1.3B shape), SERVE_FLAGS (extra `deja serve` flags).
set -euo pipefail
cd "$(dirname "$0")/.."
DEJA=${1:-build/release/cli/deja}
MODEL=${2:-build/models/opt-1.3b-random}
QUESTIONS=${QUESTIONS:-16}
MEMORY_MB=${MEMORY_MB:-256}
PORT=${DEJA_BENCH_PORT:-50074}
OUT=/tmp/deja_prefix_cache_ttft
DISK_DIR=$OUT.disk
# shellcheck source=bench/serve_lib.sh
. bench/serve_lib.sh

run_mode() {  # mode, then deja serve flags
  local mode=$1
  shift
  # shellcheck disable=SC2086  # SERVE_FLAGS is a list of flags
  start_deja_serve "$DEJA" $PORT $OUT.$mode.log --model "$MODEL" --tp 1 --metrics-port -1 \
    --step-timeout-ms 600000 --max-prefill-tokens 2048 "$@" ${SERVE_FLAGS:-}
  python3 - "$DEJA" "$PORT" "$mode" "$QUESTIONS" <<'PY'
import json, statistics, subprocess, sys
deja, port, mode, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
kjv = open("tests/data/heldout/kjv.txt").read()
wp = open("tests/data/heldout/war_and_peace.txt").read()
doc = kjv[:4300]
other = kjv[50000:54300]
def ask(prompt, cache):
    out = subprocess.run([deja, "client", "stream", "--target", "127.0.0.1:" + port, "--json",
                          "--prompt", prompt, "--max-new-tokens", "1", "--prefix-cache", cache],
                         check=True, capture_output=True, text=True).stdout
    final = [json.loads(l) for l in out.splitlines() if l.strip()][-1]
    return (final["timings"]["timeToFirstTokenMs"], int(final.get("cachedPromptTokens", 0)),
            int(final["promptTokens"]))
cache = "off" if mode == "recompute" else "on"
if mode != "recompute":
    ask(doc + "\n\nQuestion: " + wp[:130], cache)  # leaves the document in the cache
ttft, cached, prompt = [], [], []
for i in range(n):
    if mode in ("host", "disk"):
        ask(other + wp[5000 + 97 * i:5000 + 97 * i + 130], cache)  # pushes the document down
    t, c, p = ask(doc + "\n\nQuestion: " + wp[1000 + 131 * i:1000 + 131 * i + 130], cache)
    ttft.append(t)
    cached.append(c)
    prompt.append(p)
print(json.dumps({"mode": mode, "ttft_ms_median": statistics.median(ttft),
                  "ttft_ms": [round(t, 1) for t in ttft], "cached_prompt_tokens": cached,
                  "prompt_tokens": prompt}))
PY
  stop_deja_serve
}

{
  run_mode recompute --prefix-cache off
  run_mode memory --prefix-cache-memory-mb 1024 --kv-memory-mb 4096
  run_mode host --prefix-cache-memory-mb "$MEMORY_MB" --prefix-cache-host-mb 4096
  rm -rf "$DISK_DIR"
  run_mode disk --prefix-cache-memory-mb "$MEMORY_MB" --prefix-cache-host-mb 0 \
    --prefix-cache-dir "$DISK_DIR"
  rm -rf "$DISK_DIR"
} | tee $OUT.json
python3 - $OUT.json <<'PY'
import json, sys
rows = {r["mode"]: r for r in map(json.loads, open(sys.argv[1]))}
base = rows["recompute"]["ttft_ms_median"]
for mode, r in rows.items():
    if mode != "recompute":
        print("%s hit: TTFT %.1f ms, %.1fx faster than recompute (%.1f ms)"
              % (mode, r["ttft_ms_median"], base / r["ttft_ms_median"], base))
PY
