#!/usr/bin/env bash
# How the H2O budget's split between heavy and recent slots changes held-out perplexity on
# opt-mini (1024-token windows, prompt 256, the setting of bench/h2o_quality.sh). At each budget
# the heavy share goes from 0 (every slot recent: the window policy, run as h2o) to 3/4, with the
# reference's summed scores; the half/half split also runs with --h2o-score mean (the
# age-normalised alternative).
# One JSON line per run. Usage: bench/h2o_split.sh [path/to/deja] [text files...]
set -euo pipefail
cd "$(dirname "$0")/.."
DEJA=${1:-build/release/cli/deja}
shift || true
FILES=("$@")
[ ${#FILES[@]} -gt 0 ] || FILES=(tests/data/heldout/tinyshakespeare.txt tests/data/heldout/kjv.txt)
CTX=1024
for f in "${FILES[@]}"; do
  for pct in 20 10; do
    budget=$((CTX * pct / 100))
    for run in 0:sum 1:sum 2:sum 4:sum 6:sum 4:mean; do
      eighths=${run%%:*}
      score=${run##*:}
      heavy=$((budget * eighths / 8))
      recent=$((budget - heavy))
      "$DEJA" ppl --model models/opt-mini --text "$f" --context $CTX --kv-policy h2o \
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
