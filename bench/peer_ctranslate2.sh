#!/usr/bin/env bash
# deja against its CPU peers, CTranslate2 and OpenVINO (through optimum-intel), on the same
# random-weight OPT checkpoint: batch-1 decode ms/token, batch-16 decode ms/step and prefill
# tokens/s, the same thread count for every engine, alternating engine by engine, run by run.
# Prints per metric each engine's median and the median of deja/peer speedups from the same
# round (>1: deja faster); --out keeps every run as JSON. The peers are measuring sticks only:
# each lives in its own venv, never in deja. Quality beside speed: bench/peer_quality.py.
#
#   bash bench/peer_ctranslate2.sh                       # OPT-1.3B shape, 3 rounds, 2 threads
#   bash bench/peer_ctranslate2.sh --shape 125m --rounds 1 --out /tmp/peer.json
#
# Flags (defaults in brackets):
#   --shape S          checkpoint shape for tools/checkpoints/make_random_opt.py [1.3b]
#   --layers N         fewer layers than the shape has (quick functional runs)
#   --model DIR        use this HF OPT checkpoint instead of generating one
#   --deja BIN         deja binary [build/release/cli/deja of this repo]
#   --threads N        threads for both engines [2]
#   --rounds N         rounds; each runs every engine configuration once; 0 only prepares
#                      the venv, checkpoint and conversions [3]
#   --prefill-tokens N [512]   --prompt-tokens N [64]   --decode-steps N [64]
#   --deja-modes LIST  bf16 (--dtype bf16 --kv-dtype f16), int8 (--dtype int8 --kv-dtype f16),
#                      int4 (--dtype int4 --kv-dtype f16); a mode the binary rejects is skipped
#                      with a note [bf16,int8,int4]
#   --ct2-types LIST   CTranslate2 compute types (each converted with that quantization);
#                      one the CPU lacks is skipped with a note; none: no CTranslate2 [int8]
#   --ov-weights LIST  OpenVINO weight formats, each exported with optimum-intel: int8, int4
#                      (symmetric, groups of 128); its other settings are OpenVINO's defaults
#                      and each run reports the precision and KV type it chose; none: no
#                      OpenVINO [int8,int4]
#   --converter C      hf: CTranslate2's ct2-transformers-converter (installs transformers and
#                      torch, ~6 GB: PyPI's Linux torch wheels pull the CUDA libraries);
#                      numpy: the same spec built by bench/peer_ctranslate2.py from the
#                      safetensors with numpy (~100 MB venv; byte-identical model.bin) [hf]
#   --out FILE         JSON with the machine, the summary and every run (FILE.runs.jsonl
#                      holds the runs while it goes) [$CACHE/peer-ctranslate2-DATE.json]
# Environment: DEJA_PEER_VENV [~/.cache/deja/peer-venv] (reused when it exists),
#              DEJA_PEER_OV_VENV [~/.cache/deja/peer-ov-venv] (OpenVINO's, apart: optimum-intel
#              pins its own transformers),
#              DEJA_PEER_CACHE [~/.cache/deja/peer] (checkpoints, converted models, results).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
HELPER=$REPO/bench/peer_ctranslate2.py
OV_HELPER=$REPO/bench/peer_openvino.py
OV_VENV=${DEJA_PEER_OV_VENV:-$HOME/.cache/deja/peer-ov-venv}
VENV=${DEJA_PEER_VENV:-$HOME/.cache/deja/peer-venv}
CACHE=${DEJA_PEER_CACHE:-$HOME/.cache/deja/peer}
SHAPE=1.3b LAYERS= MODEL= DEJA=$REPO/build/release/cli/deja THREADS=2 ROUNDS=3
PREFILL=512 PROMPT=64 STEPS=64 DEJA_MODES=bf16,int8,int4 CT2_TYPES=int8 OV_WEIGHTS=int8,int4
CONVERTER=hf OUT=

die() { echo "peer_ctranslate2: $*" >&2; exit 1; }
while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || die "$1 needs a value"
  case $1 in
    --shape) SHAPE=${2#opt-} ;;
    --layers) LAYERS=$2 ;;
    --model) MODEL=$2 ;;
    --deja) DEJA=$2 ;;
    --threads) THREADS=$2 ;;
    --rounds) ROUNDS=$2 ;;
    --prefill-tokens) PREFILL=$2 ;;
    --prompt-tokens) PROMPT=$2 ;;
    --decode-steps) STEPS=$2 ;;
    --deja-modes) DEJA_MODES=$2 ;;
    --ct2-types) CT2_TYPES=$2 ;;
    --ov-weights) OV_WEIGHTS=$2 ;;
    --converter) CONVERTER=$2 ;;
    --out) OUT=$2 ;;
    *) die "unknown flag $1 (see the head of $0)" ;;
  esac
  shift 2
done
case $CONVERTER in hf | numpy) ;; *) die "--converter must be hf or numpy" ;; esac
[ -x "$DEJA" ] || die "no deja binary at $DEJA (build it: bash scripts/build.sh, or pass --deja)"
T_START=$(date +%s)
mkdir -p "$CACHE"
OUT=${OUT:-$CACHE/peer-ctranslate2-$(date -u +%Y%m%dT%H%M%SZ).json}

# --- the peers' venvs ---------------------------------------------------------------------------
[ "$CT2_TYPES" = none ] && CT2_TYPES=
[ "$OV_WEIGHTS" = none ] && OV_WEIGHTS=
# Without CTranslate2 the system's python3 runs the standard-library parts (report, numpy for
# the checkpoint).
PY=python3
INFO='{}'
if [ -n "$CT2_TYPES" ]; then
  if [ $CONVERTER = hf ]; then
    PKGS=(ctranslate2 numpy transformers torch) IMPORTS="ctranslate2, numpy, transformers, torch"
  else
    PKGS=(ctranslate2 numpy) IMPORTS="ctranslate2, numpy"
  fi
  PY=$VENV/bin/python
  if [ ! -x "$PY" ]; then
    echo "== making the venv $VENV" >&2
    python3 -m venv "$VENV" || die "python3 -m venv $VENV failed"
  fi
  if ! (cd / && "$PY" -c "import $IMPORTS") 2>/dev/null; then
    echo "== pip install ${PKGS[*]} into $VENV (PyPI)" >&2
    "$PY" -m pip install --quiet "${PKGS[@]}" ||
      die "pip could not install ${PKGS[*]} into $VENV (is PyPI reachable?)"
    (cd / && "$PY" -c "import $IMPORTS") || die "installed, but 'import $IMPORTS' fails in $VENV"
  fi
  INFO=$(cd / && "$PY" "$HELPER" info) || die "ctranslate2 does not load in $VENV"
  echo "== ctranslate2: $INFO" >&2
fi
OV_PY=$OV_VENV/bin/python
OV_INFO='{}'
if [ -n "$OV_WEIGHTS" ]; then
  if [ ! -x "$OV_PY" ]; then
    echo "== making the venv $OV_VENV" >&2
    python3 -m venv "$OV_VENV" || die "python3 -m venv $OV_VENV failed"
  fi
  if ! (cd / && "$OV_PY" -c "import openvino, optimum.intel, nncf, numpy") 2>/dev/null; then
    echo "== pip install optimum-intel[openvino] nncf numpy into $OV_VENV (PyPI)" >&2
    "$OV_PY" -m pip install --quiet "optimum-intel[openvino]" nncf numpy ||
      die "pip could not install optimum-intel into $OV_VENV (is PyPI reachable?)"
  fi
  OV_INFO=$(cd / && "$OV_PY" "$OV_HELPER" info) || die "openvino does not load in $OV_VENV"
  echo "== openvino: $OV_INFO" >&2
fi

# --- the checkpoint ----------------------------------------------------------------------------
if [ -z "$MODEL" ]; then
  MODEL=$CACHE/models/opt-$SHAPE-random${LAYERS:+-l$LAYERS}
  if [ ! -f "$MODEL/config.json" ] || ! ls "$MODEL"/*.safetensors >/dev/null 2>&1; then
    echo "== generating $MODEL" >&2
    "$PY" "$REPO/tools/checkpoints/make_random_opt.py" --shape "$SHAPE" --out "$MODEL.partial" \
      ${LAYERS:+--layers $LAYERS} || die "make_random_opt.py failed"
    rm -rf "$MODEL" && mv "$MODEL.partial" "$MODEL"
  fi
fi
MODEL=$(cd "$MODEL" && pwd)
[ -f "$MODEL/config.json" ] || die "$MODEL has no config.json"

# --- deja modes the binary accepts ---------------------------------------------------------------
NOTES=()
DEJA_OK=()
for mode in ${DEJA_MODES//,/ }; do
  case $mode in
    bf16) flags="--dtype bf16 --kv-dtype f16" ;;
    int8) flags="--dtype int8 --kv-dtype f16" ;;
    int4) flags="--dtype int4 --kv-dtype f16" ;;
    *) die "unknown deja mode $mode (bf16, int8, int4)" ;;
  esac
  # Try it: a tiny run with the mode's flags on the real checkpoint.
  if err=$("$DEJA" bench decode --model "$MODEL" --threads "$THREADS" $flags --batches 1 \
    --decode-steps 1 --prompt-tokens 1 --prefill-tokens 1 --warmup-rounds 0 --json 2>&1 >/dev/null); then
    DEJA_OK+=("$mode")
  else
    NOTES+=("deja mode $mode ($flags) skipped: $(echo "$err" | tail -1)")
    echo "note: ${NOTES[-1]}" >&2
  fi
done

# --- CTranslate2 models --------------------------------------------------------------------------
KEY=$( (echo "$MODEL"; stat -c '%n %s %Y' "$MODEL"/config.json "$MODEL"/*.safetensors) | sha1sum | cut -c1-10)
CT2_OK=()
for t in ${CT2_TYPES//,/ }; do
  if ! echo "$INFO" | "$PY" -c "import json,sys; sys.exit('$t' not in json.load(sys.stdin)['cpu_compute_types'])"; then
    NOTES+=("ctranslate2 compute type $t skipped: not supported on this CPU")
    echo "note: ${NOTES[-1]}" >&2
    continue
  fi
  dir=$CACHE/ct2/$(basename "$MODEL")-$KEY-$t
  if [ ! -f "$dir/model.bin" ]; then
    echo "== converting $MODEL for CTranslate2 ($t, $CONVERTER converter)" >&2
    (cd / && "$PY" "$HELPER" convert --model "$MODEL" --out "$dir" --quantization "$t" \
      --converter "$CONVERTER") || die "conversion to $t failed"
  fi
  CT2_OK+=("$t")
done
# --- OpenVINO exports ---------------------------------------------------------------------------
OV_OK=()
for w in ${OV_WEIGHTS//,/ }; do
  dir=$CACHE/ov/$(basename "$MODEL")-$KEY-$w
  if [ ! -f "$dir/openvino_model.xml" ]; then
    echo "== exporting $MODEL for OpenVINO ($w weights)" >&2
    rm -rf "$dir.partial"
    (cd / && "$OV_PY" "$OV_HELPER" export --model "$MODEL" --out "$dir.partial" --weights "$w") ||
      die "export with $w weights failed"
    rm -rf "$dir" && mv "$dir.partial" "$dir"
  fi
  OV_OK+=("$w")
done
[ ${#DEJA_OK[@]} -gt 0 ] || die "no deja mode runs with $DEJA"
[ $((${#CT2_OK[@]} + ${#OV_OK[@]})) -gt 0 ] || die "no peer configuration to run"

# --- the rounds ----------------------------------------------------------------------------------
# Configurations interleaved (deja, ct2, deja, ...), the order reversed every other round so
# neither engine always runs first after the other.
CONFIGS=()
i=0
while [ $i -lt ${#DEJA_OK[@]} ] || [ $i -lt ${#CT2_OK[@]} ] || [ $i -lt ${#OV_OK[@]} ]; do
  [ $i -lt ${#DEJA_OK[@]} ] && CONFIGS+=("deja-${DEJA_OK[$i]}")
  [ $i -lt ${#CT2_OK[@]} ] && CONFIGS+=("ct2-${CT2_OK[$i]}")
  [ $i -lt ${#OV_OK[@]} ] && CONFIGS+=("ov-${OV_OK[$i]}")
  i=$((i + 1))
done
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$(dirname "$OUT")"
RUNS=$OUT.runs.jsonl # every run as it ends, so an interrupted campaign keeps what it measured
: >"$RUNS"
run_one() { # round config
  local r=$1 c=$2 t0 t1 line cmd
  if [[ $c == deja-* ]]; then
    local flags="--dtype ${c#deja-} --kv-dtype f16"
    cmd="$DEJA bench decode --model $MODEL --threads $THREADS $flags --batches 1,16 \
--prefill-tokens $PREFILL --prompt-tokens $PROMPT --decode-steps $STEPS --json"
    t0=$(date +%s.%N)
    line=$($cmd 2>"$WORK/err" | tail -1) || { cat "$WORK/err" >&2; die "run failed: $cmd (runs so far: $RUNS)"; }
  elif [[ $c == ov-* ]]; then
    local w=${c#ov-}
    cmd="$OV_PY $OV_HELPER run --model $CACHE/ov/$(basename "$MODEL")-$KEY-$w --weights $w \
--threads $THREADS --batches 1,16 --prefill-tokens $PREFILL --prompt-tokens $PROMPT \
--decode-steps $STEPS"
    t0=$(date +%s.%N)
    line=$(cd / && $cmd 2>"$WORK/err" | tail -1) || { cat "$WORK/err" >&2; die "run failed: $cmd (runs so far: $RUNS)"; }
  else
    local t=${c#ct2-}
    cmd="$PY $HELPER run --model $CACHE/ct2/$(basename "$MODEL")-$KEY-$t --compute-type $t \
--threads $THREADS --batches 1,16 --prefill-tokens $PREFILL --prompt-tokens $PROMPT \
--decode-steps $STEPS"
    t0=$(date +%s.%N)
    line=$(cd / && $cmd 2>"$WORK/err" | tail -1) || { cat "$WORK/err" >&2; die "run failed: $cmd (runs so far: $RUNS)"; }
  fi
  t1=$(date +%s.%N)
  "$PY" - "$r" "$c" "$cmd" "$t0" "$t1" "$line" >>"$RUNS" <<'PY' || die "$c printed no JSON: $line"
import json, sys
r, c, cmd, t0, t1, line = sys.argv[1:]
res = json.loads(line)
print(json.dumps({"round": int(r), "config": c, "cmd": " ".join(cmd.split()),
                  "wall_s": round(float(t1) - float(t0), 2), "result": res}))
d = {x["batch"]: x["ms_per_step"] for x in res["decode"]}
print(f"round {r} {c:12} prefill {res['prefill_tokens_per_s']:9.1f} tokens/s  batch 1 "
      f"{d[1]:8.2f} ms  batch 16 {d[16]:8.2f} ms  ({float(t1) - float(t0):.0f} s)",
      file=sys.stderr)
PY
}
echo "== $ROUNDS rounds of: ${CONFIGS[*]} (threads $THREADS, $MODEL)" >&2
for r in $(seq "$ROUNDS"); do
  order=("${CONFIGS[@]}")
  if [ $((r % 2)) -eq 0 ]; then
    order=()
    for ((k = ${#CONFIGS[@]} - 1; k >= 0; k--)); do order+=("${CONFIGS[$k]}"); done
  fi
  for c in "${order[@]}"; do run_one "$r" "$c"; done
done

# --- the report ----------------------------------------------------------------------------------
CPU=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
"$PY" - "$WORK/meta.json" "$INFO" "$OV_INFO" "$CPU" "$(nproc)" "$THREADS" "$MODEL" "$DEJA" \
  "$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)" "$CONVERTER" \
  "$PREFILL" "$PROMPT" "$STEPS" "$ROUNDS" "$(($(date +%s) - T_START))" "${NOTES[@]+"${NOTES[@]}"}" <<'PY'
import json, sys, time
(out, info, ov_info, cpu, cores, threads, model, deja, rev, conv, prefill, prompt, steps, rounds,
 elapsed, *notes) = sys.argv[1:]
meta = dict(json.loads(info), openvino_info=json.loads(ov_info), cpu=cpu, cores=int(cores), threads=int(threads), model=model,
            model_config=json.load(open(model + "/config.json")), deja=deja, deja_git=rev,
            converter=conv, prefill_tokens=int(prefill), prompt_tokens=int(prompt),
            decode_steps=int(steps), rounds=int(rounds), elapsed_s=int(elapsed),
            date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), notes=notes)
json.dump(meta, open(out, "w"))
PY
"$PY" "$HELPER" report --runs "$RUNS" --meta "$WORK/meta.json" --out "$OUT"
rm -f "$RUNS" # now inside $OUT
echo "total $(($(date +%s) - T_START)) s" >&2
