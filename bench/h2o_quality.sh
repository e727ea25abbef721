#!/usr/bin/env bash
# Held-out perplexity of opt-mini under full, h2o and window caches at budgets of 50%, 20% and
# 10% of the 1024-token window, each window evaluated as serving runs it (prompt 256, then token
# by token), plus the KV-memory capacity comparison. One run; prints JSON lines and a table.
#   bash bench/h2o_quality.sh [build/release/cli/deja] [text files...]
set -euo pipefail
cd "$(dirname "$0")/.."
DEJA=${1:-build/release/cli/deja}
shift || true
FILES=("$@")
[ ${#FILES[@]} -gt 0 ] || FILES=(tests/data/heldout/tinyshakespeare.txt tests/data/heldout/kjv.txt)
MODEL=models/opt-mini
CTX=1024
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
