#!/usr/bin/env bash
# Time to first token with the prefix cache, one run: `deja serve` at TP 1 on the OPT-1.3B
# shape, ~1,000-token documents (held-out kjv text) and 32-token questions (held-out
# war_and_peace text), QUESTIONS requests asked one at a time (max_new_tokens 1). Modes:
#   recompute  every request computes its whole prompt (PrefixCache.MODE_OFF), document i with
#              question i
#   memory     one document, which a first request left in the workers' memory tier
#   host       QUESTIONS documents are sent first (each with another question); the memory tier
#              holds one, so the earlier ones move to host memory; then question i is asked of
#              document i, which comes back from host (and pushes the last one out)
#   disk       as host, with no host tier: the blocks come back from the disk tier's files
#              (through the page cache: files this recent are usually still in memory)
#   disk-cold  as disk, with the files dropped from the page cache before each question
#              (fsync + posix_fadvise DONTNEED), so they are read from the device
#   *-important  host, disk and disk-cold with --prefix-load important: the prefix is read
#              where it is, each layer only the tokens the probe heads choose
#              (--prefix-kept-fraction KEPT, default 0.5)
# Each cached mode asks its questions ROUNDS times (default 2), each round with new questions:
# the first important round reads files in position order and the workers rewrite them in the
# background with the tokens it chose first (--prefix-file-order importance), so later rounds
# read the chosen tokens contiguously.
# Prints one JSON line per mode (the last round's median and each TTFT in ms, cached prompt
# tokens, bytes the workers read per question from host and disk; each round's median and
# bytes) and the ratios against recompute and of each important mode against its full-loading
# mode, from the last round.
#   bash bench/prefix_cache_ttft.sh [build/release/cli/deja] [model dir]
# Environment: QUESTIONS (default 16), MEMORY_MB (memory tier, default 256: one document of the
# 1.3B shape), DOC_CHARS (characters per document, default 4300: ~1,000 tokens), SERVE_FLAGS
# (extra `deja serve` flags), KEPT (the kept fraction of the important modes), MODES (which
# modes, in order; default all of them). The host and disk modes keep QUESTIONS
# documents: ~3.3 GB of host memory or of /tmp at 16.
set -euo pipefail
cd "$(dirname "$0")/.."
DEJA=${1:-build/release/cli/deja}
MODEL=${2:-build/models/opt-1.3b-random}
QUESTIONS=${QUESTIONS:-16}
ROUNDS=${ROUNDS:-2}
MEMORY_MB=${MEMORY_MB:-256}
KEPT=${KEPT:-0.5}
MODES=${MODES:-recompute memory host host-important disk disk-important disk-cold disk-cold-important}
DOC_CHARS=${DOC_CHARS:-4300}
PORT=${DEJA_BENCH_PORT:-50074}
OUT=/tmp/deja_prefix_cache_ttft
DISK_DIR=$OUT.disk
# shellcheck source=bench/serve_lib.sh
. bench/serve_lib.sh

run_mode() {  # mode, then deja serve flags
  local mode=$1
  shift
  # shellcheck disable=SC2086  # SERVE_FLAGS is a list of flags
  start_deja_serve "$DEJA" $PORT $OUT.$mode.log --model "$MODEL" --tp 1 \
    --metrics-port $((PORT + 1)) --http-port -1 --metrics-host 127.0.0.1 \
    --step-timeout-ms 600000 --max-prefill-tokens 2048 "$@" ${SERVE_FLAGS:-}
  python3 - "$DEJA" "$PORT" "$mode" "$QUESTIONS" "$DOC_CHARS" "$DISK_DIR" "$ROUNDS" <<'PY'
import json, os, re, statistics, subprocess, sys, time, urllib.request
deja, port, mode, n, chars = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
disk_dir = sys.argv[6]
rounds = 1 if mode == "recompute" else int(sys.argv[7])
def read_bytes():
    text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % (int(port) + 1)).read().decode()
    out = {}
    for key, series in (("host", 'read_bytes_total{tier="host"}'),
                        ("disk", 'read_bytes_total{tier="disk"}'),
                        ("chosen", 'important_layers_total{result="chosen"}'),
                        ("fallback", 'important_layers_total{result="fallback"}'),
                        ("reordered", 'reordered_files_total')):
        m = re.search(r'^deja_prefix_cache_%s (\S+)' % re.escape(series), text, re.M)
        out[key] = float(m.group(1)) if m else 0.0
    return out
def drop_page_cache():
    for root, _, files in os.walk(disk_dir):
        for f in files:
            if not f.endswith(".kvb"):
                continue
            try:
                fd = os.open(os.path.join(root, f), os.O_RDONLY)
            except FileNotFoundError:  # dropped meanwhile
                continue
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
kjv = open("tests/data/heldout/kjv.txt").read()
wp = open("tests/data/heldout/war_and_peace.txt").read()
def doc(i):
    return kjv[5000 * i:5000 * i + chars] + "\n\nQuestion: "
def question(i):
    return wp[1000 + 131 * i:1000 + 131 * i + 130]
def ask(prompt, cache):
    out = subprocess.run([deja, "client", "stream", "--target", "127.0.0.1:" + port, "--json",
                          "--prompt", prompt, "--max-new-tokens", "1", "--prefix-cache", cache],
                         check=True, capture_output=True, text=True).stdout
    final = [json.loads(l) for l in out.splitlines() if l.strip()][-1]
    return (final["timings"]["time_to_first_token_ms"], int(final.get("cached_prompt_tokens", 0)),
            int(final["prompt_tokens"]))
cache = "off" if mode == "recompute" else "on"
if mode == "memory":
    ask(doc(0) + question(n), cache)  # leaves the document in the cache
elif mode != "recompute":
    for i in range(n):
        ask(doc(i) + question(n + i), cache)
per_round = []
for r in range(rounds):
    ttft, cached, prompt = [], [], []
    before = read_bytes()
    for i in range(n):
        if mode.startswith("disk-cold"):
            drop_page_cache()
        q = question(i if r == 0 else (r + 1) * n + i)
        t, c, p = ask(doc(0 if mode == "memory" else i) + q, cache)
        ttft.append(t)
        cached.append(c)
        prompt.append(p)
    after = read_bytes()
    per_round.append({"ttft_ms_median": statistics.median(ttft),
                      "host_mb_read_per_question": round((after["host"] - before["host"]) / n / 2**20, 1),
                      "disk_mb_read_per_question": round((after["disk"] - before["disk"]) / n / 2**20, 1),
                      "layers_chosen": after["chosen"] - before["chosen"],
                      "layers_fallback": after["fallback"] - before["fallback"],
                      "files_reordered": after["reordered"] - before["reordered"]})
    if r + 1 < rounds:
        time.sleep(2)  # the background rewrites of the last question's files
last = per_round[-1]
print(json.dumps(dict(mode=mode, **last, ttft_ms=[round(t, 1) for t in ttft],
                      cached_prompt_tokens=cached, prompt_tokens=prompt,
                      rounds=per_round)))
PY
  stop_deja_serve
}

run() {  # mode
  local mode=$1 load=full
  case $mode in *-important) load=important ;; esac
  local flags=(--prefix-load "$load" --prefix-kept-fraction "$KEPT")
  case $mode in
    recompute) run_mode recompute --prefix-cache off ;;
    memory) run_mode memory --prefix-cache-memory-mb 1024 --kv-memory-mb 4096 ;;
    host*)
      run_mode "$mode" --prefix-cache-memory-mb "$MEMORY_MB" --prefix-cache-host-mb 4096 \
        "${flags[@]}"
      ;;
    disk*)
      rm -rf "$DISK_DIR"
      run_mode "$mode" --prefix-cache-memory-mb "$MEMORY_MB" --prefix-cache-host-mb 0 \
        --prefix-cache-dir "$DISK_DIR" "${flags[@]}"
      rm -rf "$DISK_DIR"
      ;;
    *) echo "unknown mode $mode" >&2 && return 1 ;;
  esac
}

{
  for mode in $MODES; do run "$mode"; done
} | tee $OUT.json
python3 - $OUT.json <<'PY'
import json, sys
rows = {r["mode"]: r for r in map(json.loads, open(sys.argv[1]))}
base = rows.get("recompute", {}).get("ttft_ms_median")
for mode, r in rows.items():
    if mode != "recompute" and base:
        print("%s hit: TTFT %.1f ms, %.1fx faster than recompute (%.1f ms)"
              % (mode, r["ttft_ms_median"], base / r["ttft_ms_median"], base))
for mode, r in rows.items():
    full = rows.get(mode[:-len("-important")]) if mode.endswith("-important") else None
    if full:
        def mb(x):
            return x["host_mb_read_per_question"] + x["disk_mb_read_per_question"]
        print("%s: TTFT %.1f ms vs %.1f ms loading everything (%.2fx); %.1f MB read per question "
              "vs %.1f (%.2fx less)" % (mode, r["ttft_ms_median"], full["ttft_ms_median"],
                                        full["ttft_ms_median"] / r["ttft_ms_median"], mb(r),
                                        mb(full), mb(full) / max(mb(r), 1e-9)))
PY
