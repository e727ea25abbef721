#!/usr/bin/env bash
# How far any per-token retaining score could take locret at a 20% budget: opt-mini's held-out
# perplexity with locret's tokens scored in hindsight (`deja-lab ppl --locret-oracle`: the attention the
# window's scored positions give each token in a dense run) against the trained retaining heads and
# a recent window of the same budget, in the two modes of bench/locret_quality.sh (a: prompt 256,
# b: prompt 896). One JSON line per (text, mode, scorer, skip, tokens scored); one run.
#   bash bench/locret_oracle.sh [build/release/lab/deja-lab] [text files...]
# SPLITS: tokens kept by score (the rest of the budget are stabilisers); SKIPS: 0, or 1 to never
# keep the BOS by score.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/heldout_args.sh "$@"
CTX=1024
BUDGET=$((CTX * 20 / 100))
MODES=${MODES:-a b}
SPLITS=${SPLITS:-1 4 25}
SKIPS=${SKIPS:-0 1}
run() {  # text mode policy scorer skip scored
  local f=$1 mode=$2 policy=$3 scorer=$4 skip=$5 scored=$6 prompt=256
  [ "$mode" = b ] && prompt=$((CTX - 128))
  local flags=(--heavy-tokens "$scored" --recent-tokens $((BUDGET - scored)))
  [ "$policy" = locret ] && [ "$scorer" != heads ] &&
    flags+=(--locret-oracle "$scorer" --locret-oracle-skip "$skip")
  "$DEJA" ppl --model "$MODEL" --text "$f" --context $CTX --kv-policy "$policy" "${flags[@]}" \
    --prompt-tokens $prompt --json 2>/dev/null | tail -1 | python3 -c "
import json, sys
j = json.load(sys.stdin)
print(json.dumps({'text': '$(basename "$f" .txt)', 'mode': '$mode', 'policy': '$policy',
                  'scorer': '$scorer', 'skip': $skip, 'scored': $scored,
                  'stabilisers': $((BUDGET - scored)), 'perplexity': round(j['perplexity'], 3)}))"
}
for f in "${FILES[@]}"; do
  for mode in $MODES; do
    run "$f" "$mode" window none 0 0
    for scored in $SPLITS; do
      run "$f" "$mode" locret heads 0 "$scored"
      for skip in $SKIPS; do
        run "$f" "$mode" locret sum "$skip" "$scored"
        run "$f" "$mode" locret max "$skip" "$scored"
      done
    done
  done
done
