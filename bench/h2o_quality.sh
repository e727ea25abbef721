#!/usr/bin/env bash
# Held-out perplexity of opt-mini under full, h2o and window caches at budgets of 50%, 20% and
# 10% of the 1024-token window, each window evaluated as serving runs it (prompt 256, then token
# by token), plus the KV-memory capacity comparison. One run; prints JSON lines and a table.
#   bash bench/h2o_quality.sh [build/release/lab/deja-lab] [text files...]
# With SPLIT=1 it measures instead how the h2o budget's split between heavy and recent slots
# changes perplexity: at 20% and 10% the heavy share goes from 0 (every slot recent: the window
# policy, run as h2o) to 3/4 with the reference's summed scores, and the half/half split also runs
# with --h2o-score mean (the age-normalised alternative). One JSON line per run.
# With VARIANTS=1 it compares, at a 20% budget, full and window with h2o as the reference runs it
# (half heavy, half recent, summed scores) and the alternatives: a smaller heavy share, the mean
# score, decayed scores (--h2o-decay) and sinks (--sink-tokens). One JSON line per run.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/heldout_args.sh "$@"
CTX=1024
if [ "${VARIANTS:-0}" = 1 ]; then
  budget=$((CTX / 5))
  for f in "${FILES[@]}"; do
    # label:policy:heavy:flags
    for run in "full:full:0:" "window:window:0:" "h2o:h2o:$((budget / 2)):" \
      "h2o_decay0.95:h2o:$((budget / 2)):--h2o-decay 0.95" \
      "h2o_sinks4:h2o:$((budget / 2)):--sink-tokens 4" \
      "h2o_mean:h2o:$((budget / 2)):--h2o-score mean" \
      "h2o_heavy1/8:h2o:$((budget / 8)):" "h2o_heavy1/16_mean:h2o:$((budget / 16)):--h2o-score mean" \
      "h2o_heavy4:h2o:4:" "h2o_heavy8_decay0.6:h2o:8:--h2o-decay 0.6" \
      "h2o_heavy4_decay0.6:h2o:4:--h2o-decay 0.6"; do
      IFS=: read -r label policy heavy flags <<<"$run"
      recent=$((budget - heavy))
      budget_flags=()
      [ "$policy" = full ] || budget_flags=(--heavy-tokens "$heavy" --recent-tokens "$recent")
      [ "$policy" = window ] && budget_flags=(--heavy-tokens 0 --recent-tokens "$budget")
      # shellcheck disable=SC2086  # flags is a list of flags
      "$DEJA" ppl --model $MODEL --text "$f" --context $CTX --kv-policy "$policy" \
        "${budget_flags[@]}" --prompt-tokens 256 $flags --json 2>/dev/null | tail -1 |
        python3 -c "
import json, sys
j = json.load(sys.stdin)
print(json.dumps({'text': '$(basename "$f" .txt)', 'run': '$label', 'heavy': $heavy,
                  'recent': $recent, 'perplexity': round(j['perplexity'], 2)}))"
    done
  done
  exit 0
fi
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
