#!/usr/bin/env bash
# Held-out perplexity of opt-mini under full, window, h2o and locret caches at budgets of 50%, 20%
# and 10% of the 1024-token window, each window evaluated as serving runs it, in two modes:
#   a: prompt 256 (prefilled at once; locret in chunks), the other 768 tokens decoded and scored;
#   b: prompt 896, the last 128 tokens decoded and scored: the policy acts during the prefill.
# Also the peak KV tokens per head and bytes per sequence during the prompt. One run; one JSON line
# per (text, mode, policy, budget).
#   bash bench/locret_quality.sh [build/release/lab/deja-lab] [text files...]
# Budgets: h2o half heavy hitters, half recent; window all recent; locret budget / SCORED (default
# 1/8) kept by retaining-head score, the rest stabilisers, prefilled in chunks of CHUNK (64).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/heldout_args.sh "$@"
HEADS=${HEADS:-$MODEL/retaining.safetensors}
CTX=1024
CHUNK=${CHUNK:-64}
SCORED=${SCORED:-8}  # tokens kept by score = budget / SCORED
MODES=${MODES:-a b}
PCTS=${PCTS:-50 20 10}
run() {  # text mode policy pct heavy recent
  local f=$1 mode=$2 policy=$3 pct=$4 heavy=$5 recent=$6 prompt=256
  [ "$mode" = b ] && prompt=$((CTX - 128))
  local flags=()
  [ "$policy" = full ] || flags=(--heavy-tokens "$heavy" --recent-tokens "$recent")
  [ "$policy" = locret ] && flags+=(--retaining-heads "$HEADS" --locret-chunk "$CHUNK")
  "$DEJA" ppl --model "$MODEL" --text "$f" --context $CTX --kv-policy "$policy" "${flags[@]}" \
    --prompt-tokens $prompt --json 2>/dev/null | tail -1 | python3 -c "
import json, sys
j = json.load(sys.stdin)
print(json.dumps({'text': '$(basename "$f" .txt)', 'mode': '$mode', 'policy': '$policy',
                  'budget_pct': $pct, 'heavy': $heavy, 'recent': $recent,
                  'perplexity': round(j['perplexity'], 3),
                  'peak_prompt_tokens_per_head': j['peak_prompt_tokens_per_head'],
                  'peak_prompt_kv_bytes': j['peak_prompt_kv_bytes'], 'tokens': j['tokens']}))"
}
for f in "${FILES[@]}"; do
  for mode in $MODES; do
    run "$f" "$mode" full 100 0 0
    for pct in $PCTS; do
      budget=$((CTX * pct / 100))
      run "$f" "$mode" window "$pct" 0 "$budget"
      run "$f" "$mode" h2o "$pct" $((budget / 2)) $((budget - budget / 2))
      scored=$((budget / SCORED))
      run "$f" "$mode" locret "$pct" "$scored" $((budget - scored))
    done
  done
done
