# Sourced by the held-out quality benchmarks with their arguments: DEJA is the first (default the
# release build's deja-lab), FILES the rest (default the three held-out texts), MODEL the environment's
# MODEL (default models/opt-mini).
DEJA=${1:-build/release/lab/deja-lab}
FILES=("${@:2}")
[ ${#FILES[@]} -gt 0 ] || FILES=(tests/data/heldout/tinyshakespeare.txt tests/data/heldout/kjv.txt
  tests/data/heldout/war_and_peace.txt)
MODEL=${MODEL:-models/opt-mini}
