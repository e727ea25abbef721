#!/usr/bin/env bash
# The int8 KV cache against f16 on the OPT-1.3B shape: decode after a 768-token prompt at batch 1
# and 16, and a 512-token prefill (which pays for the int8 cache's batch-invariant kernels), the
# two caches alternating run by run so both see the same host state. Prints each run's figures
# and the medians of f16 / int8 step times from adjacent pairs (> 1: int8 faster), beside the
# same ratio of the two runs' rooflines. Quality:
# `python3 bench/precision_quality.py --only "f16 KV,int8 KV"` (held-out perplexity and greedy
# agreement on the trained fixture).
#   bash bench/kv_int8.sh [pairs (3)] [--dtype D (int8)] [extra bench decode flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
PAIRS=${1:-3}
shift $(($# < 1 ? $# : 1))
DTYPE=int8
if [ "${1:-}" = --dtype ]; then DTYPE=$2; shift 2; fi
DEJA=build/release/cli/deja
BIG=build/models/opt-1.3b-random
[ -f $BIG/config.json ] || python3 tools/checkpoints/make_random_opt.py --shape 1.3b --out $BIG
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
echo "host: $(nproc) threads, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "weights --dtype $DTYPE; bench decode --prompt-tokens 768 --batches 1,16 --prefill-tokens 512 $*"
for i in $(seq "$PAIRS"); do
  for kv in f16 int8; do
    "$DEJA" bench decode --model $BIG --dtype "$DTYPE" --kv-dtype $kv --prompt-tokens 768 \
      --decode-steps 16 --batches 1,16 --prefill-tokens 512 --json "$@" 2>/dev/null |
      tail -1 >"$OUT/$kv-$i.json"
  done
done
python3 - "$OUT" "$PAIRS" <<'PY'
import json, statistics, sys
out, pairs = sys.argv[1], int(sys.argv[2])
def figures(path):
    j = json.load(open(path))
    f = {"batch%d_ms_per_step" % d["batch"]: d["ms_per_step"] for d in j["decode"]}
    f["prefill512_ms_per_token"] = 1000.0 / j["prefill_tokens_per_s"]
    return f, j
def floor_ms(j, batch, bw):
    """The step's roofline at bandwidth bw (GB/s): the weights' bytes or operations, whichever
    binds, plus the K/V bytes (bench decode's floor_ms_per_step, at another bandwidth)."""
    d = next(d for d in j["decode"] if d["batch"] == batch)
    return max(j["weight_bytes"] / bw / 1e6, d["compute_floor_ms_per_step"]) + \
        d["kv_read_bytes_per_step"] / bw / 1e6
ratios, floor_ratios = {}, {}
for i in range(1, pairs + 1):
    (f16, j16), (i8, j8) = figures(f"{out}/f16-{i}.json"), figures(f"{out}/int8-{i}.json")
    # Both caches' rooflines at the higher of the two runs' bandwidths (the probe beside each
    # batch's steps moves with the host from run to run; the ratio of the floors should not).
    floors = {}
    for d in j16["decode"]:
        b = d["batch"]
        bw = max(d["bandwidth_gb_per_s"],
                 next(e for e in j8["decode"] if e["batch"] == b)["bandwidth_gb_per_s"])
        floors["batch%d_ms_per_step" % b] = (floor_ms(j16, b, bw), floor_ms(j8, b, bw), bw)
    print(json.dumps({"pair": i, "f16": {k: round(v, 2) for k, v in f16.items()},
                      "int8": {k: round(v, 2) for k, v in i8.items()},
                      "floors_f16_int8_at_gb_per_s": {k: [round(x, 2) for x in v]
                                                     for k, v in floors.items()}}))
    for k in f16:
        ratios.setdefault(k, []).append(f16[k] / i8[k])
    for k, (a, b, _) in floors.items():
        floor_ratios.setdefault(k, []).append(a / b)
med = lambda d: {k: round(statistics.median(v), 3) for k, v in d.items()}
# The ratio of the rooflines is the most the int8 cache can gain on this machine: the K/V bytes
# it saves against a step that also holds the weights' floor.
print(json.dumps({"median_f16_over_int8": med(ratios),
                  "range": {k: [round(min(v), 3), round(max(v), 3)] for k, v in ratios.items()},
                  "median_floor_f16_over_int8": med(floor_ratios)}))
PY
