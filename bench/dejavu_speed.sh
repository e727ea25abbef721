#!/usr/bin/env bash
# Deja Vu decode speed, batch 1 (and 4), dense vs sparse with the steps interleaved in one run:
#  - models/opt-mini with its trained predictors;
#  - the OPT-1.3B-shaped random checkpoint at the sparsity the opt-mini predictors reach within
#    2% perplexity (neurons and heads kept: MLP_KEEP, HEAD_KEEP), once with random predictors of
#    rank 128 (real predictor cost) and once in oracle mode (no predictor cost);
# each with the predictors on their own thread and inline.
#   bash bench/dejavu_speed.sh [build/release/cli/deja]
set -euo pipefail
cd "$(dirname "$0")/.."
DEJA=${1:-build/release/cli/deja}
MLP_KEEP=${MLP_KEEP:-0.30}
HEAD_KEEP=${HEAD_KEEP:-0.78}
BIG=build/models/opt-1.3b-random
[ -f $BIG/config.json ] || python3 tools/checkpoints/make_random_opt.py --shape 1.3b --out $BIG
python3 tools/checkpoints/make_random_predictors.py --model $BIG --rank 128 \
  --mlp-keep "$MLP_KEEP" --head-keep "$HEAD_KEEP" --out $BIG/random-predictors.safetensors >&2
run() {  # label, args...
  local label=$1
  shift
  "$DEJA" bench decode --prefill-tokens 64 --decode-steps 48 --json "$@" 2>/dev/null | tail -1 |
    python3 -c "
import json, sys
j = json.load(sys.stdin)
for d in j['decode']:
    s = d['sparse']
    print(json.dumps({'run': '$label', 'batch': d['batch'], 'dense_ms': round(d['ms_per_step'], 3),
        'sparse_ms': round(s['ms_per_step'], 3), 'speedup': round(s['speedup_vs_dense'], 3),
        'predictor_ms': round(s['predictor_ms_per_step'], 3),
        'predictor_fraction_of_step': round(s['predictor_fraction_of_step'], 4),
        'heads_kept': round(s['active_head_fraction'], 3), 'neurons_kept': round(s['active_neuron_fraction'], 3),
        'bandwidth_gb_per_s': round(j['bandwidth_gb_per_s'], 1)}))"
}
for async in on off; do
  run "opt-mini predictors async=$async" --model models/opt-mini --batches 1,4 \
    --predictors models/opt-mini/predictors.safetensors --async-predictors $async
done
for async in on off; do
  run "1.3b random-predictors async=$async" --model $BIG --batches 1 \
    --predictors $BIG/random-predictors.safetensors --async-predictors $async
done
run "1.3b oracle" --model $BIG --batches 1 --sparsity-oracle "$MLP_KEEP" --head-fraction "$HEAD_KEEP"
