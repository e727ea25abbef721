#!/usr/bin/env bash
# Held-out perplexity of opt-mini under full, h2o and window caches at budgets of 50%, 20% and
# 10% of the 1024-token window, each window evaluated as serving runs it (prompt 256, then token
# by token), plus the KV-memory capacity comparison. One run; prints JSON lines and a table.
#   bash bench/h2o_quality.sh [build/release/cli/deja] [text files...]
# With SPLIT=1 it measures instead how the h2o budget's split between heavy and recent slots
# changes perplexity: at 20% and 10% the heavy share goes from 0 (every slot recent: the window
# policy, run as h2o) to 3/4 with the reference's summed scores, and the half/half split also runs
# with --h2o-score mean (the age-normalised alternative). One JSON line per run.
set -euo pipefail
cd "$(dirname "$0")/.."
DEJA=${1:-build/release/cli/deja}
shift || true
FILES=("$@")
[ ${#FILES[@]} -gt 0 ] || FILES=(tests/data/heldout/tinyshakespeare.txt tests/data/heldout/kjv.txt)
MODEL=models/opt-mini
CTX=1024
if [ "${SPLIT:-0}" = 1 ]; then
  for f in "${FILES[@]}"; do
    for pct in 20 10; do
      budget=$((CTX * pct / 100))
      for run in 0:sum 1:sum 2:sum 4:sum 6:sum 4:mean; do
        eighths=${run%%:*}
        score=${run##*:}
        heavy=$((budget * eighths / 8))
        recent=$((budget - heavy))
        "$DEJA" ppl --model $MODEL --text "$f" --context $CTX --kv-policy h2o \
          --heavy-tokens $heavy --recent-tokens $recent --h2o-score $score --prompt-tokens 256 \
          --json 2>/dev/null |
          tail -1 | python3 -c "
import json, sys
j = json.load(sys.stdin)
print(json.dumps({'text': '$(basename "$f" .txt)', 'budget_pct': $pct, 'heavy': $heavy,
                  'recent': $recent, 'score': '$score', 'perplexity': round(j['perplexity'], 3)}))"
      done
    done
  done
  exit 0
fi
PROMPT=256
for f in "${FILES[@]}"; do
  echo "# $f"
  "$DEJA" ppl --model $MODEL --text "$f" --context $CTX --kv-policy full --prompt-tokens $PROMPT \
    --json 2>/dev/null | tail -1
  for pct in 50 20 10; do
    budget=$((CTX * pct / 100))
    heavy=$((budget / 2))
    recent=$((budget - heavy))
    for policy in h2o window; do
      "$DEJA" ppl --model $MODEL --text "$f" --context $CTX --kv-policy $policy \
        --heavy-tokens $heavy --recent-tokens $recent --prompt-tokens $PROMPT --json 2>/dev/null |
        tail -1 | sed "s/^{/{\"budget_pct\":$pct,/"
    done
  done
done
echo "# KV capacity at 256 MiB, 1024-token sequences"
"$DEJA" bench kv --model $MODEL --kv-policy full --kv-memory-mb 256 --json 2>/dev/null | tail -1
"$DEJA" bench kv --model $MODEL --kv-policy h2o --heavy-tokens 102 --recent-tokens 103 \
  --kv-memory-mb 256 --json 2>/dev/null | tail -1
