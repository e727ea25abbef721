#!/usr/bin/env bash
# Two deja binaries on the OPT-1.3B shape (bf16 weights, f16 KV cache), alternating run by run so
# both see the same host state; prints each run's figures and the medians of new / old from
# adjacent pairs (time ratios: < 1 means the new binary is faster).
#   bash bench/ab_decode.sh OLD_DEJA NEW_DEJA [pairs (3)] [extra bench decode flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
OLD=$1 NEW=$2 PAIRS=${3:-3}
shift $(($# < 3 ? $# : 3))
BIG=build/models/opt-1.3b-random
[ -f $BIG/config.json ] || python3 tools/checkpoints/make_random_opt.py --shape 1.3b --out $BIG
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
for i in $(seq "$PAIRS"); do
  for which in old new; do
    bin=$OLD
    [ $which = new ] && bin=$NEW
    "$bin" bench decode --model $BIG --dtype bf16 --kv-dtype f16 --json "$@" 2>/dev/null |
      tail -1 >"$OUT/$which-$i.json"
  done
done
python3 - "$OUT" "$PAIRS" <<'PY'
import json, statistics, sys
out, pairs = sys.argv[1], int(sys.argv[2])
def figures(path):
    j = json.load(open(path))
    f = {"prefill_ms_per_token": 1000.0 / j["prefill_tokens_per_s"]}
    for d in j["decode"]:
        f["batch%d_ms_per_step" % d["batch"]] = d["ms_per_step"]
    return f
ratios = {}
for i in range(1, pairs + 1):
    old, new = figures(f"{out}/old-{i}.json"), figures(f"{out}/new-{i}.json")
    print(json.dumps({"pair": i, "old": {k: round(v, 2) for k, v in old.items()},
                      "new": {k: round(v, 2) for k, v in new.items()}}))
    for k in old:
        ratios.setdefault(k, []).append(new[k] / old[k])
print(json.dumps({"median_new_over_old": {k: round(statistics.median(v), 3)
                                          for k, v in ratios.items()},
                  "range": {k: [round(min(v), 3), round(max(v), 3)] for k, v in ratios.items()}}))
PY
