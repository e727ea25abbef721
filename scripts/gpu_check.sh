#!/usr/bin/env bash
# The GPU check: run from the folder scripts/gpu_bundle.sh makes, on a machine with an NVIDIA GPU,
# its driver and the CUDA 13 runtime libraries (cuBLAS, cuBLASLt: from a CUDA toolkit or the
# nvidia-* Python wheels) and nothing else of deja's. Steps (each logged, a summary at the end):
#   env       nvidia-smi, the libraries each binary resolves
#   tests     every test binary of the `gpu` ctest label, with its gtest filter
#   generate  `deja generate --device cuda` on both fixtures against the HF golden tokens
#   serve     `deja serve --device cuda` and one client request (also --tp 2 or 4 over NCCL
#             where there are several GPUs)
#   bench     `deja bench decode --device cuda` on an OPT-1.3B-shaped random checkpoint
#   dejavu    dense vs Deja Vu (oracle, 10% of neurons, 50% of heads) on 6.7B and 13B shapes
# DEJA_CHECK_STEPS="tests generate" runs a subset; DEJA_CHECK_LOGS (default ./gpu-check-logs)
# holds each step's full output; DEJA_CHECK_DEVICE (default cuda) runs generate, serve and bench
# on another device (cpu: to try the script on a machine without a GPU). Exit status: the number
# of failed steps.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
logs=${DEJA_CHECK_LOGS:-$here/gpu-check-logs}
steps=${DEJA_CHECK_STEPS:-env tests generate serve bench dejavu}
dev=${DEJA_CHECK_DEVICE:-cuda}
mkdir -p "$logs"
export DEJA_SOURCE_DIR=$here
deja=$here/bin/deja

# CUDA libraries: the toolkit's, then the Python wheels' (nvidia/<lib>/lib or nvidia/cu13/lib).
cuda_dirs=$here/lib
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib \
  /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do
  [ -d "$d" ] && cuda_dirs=$cuda_dirs:$d
done
if command -v python3 >/dev/null; then
  for d in $(python3 - <<'EOF' 2>/dev/null
import glob, os, site
roots = site.getsitepackages() + [site.getusersitepackages()]
for r in roots:
    for lib in sorted(glob.glob(os.path.join(r, "nvidia", "*", "lib"))):
        print(lib)
EOF
  ); do cuda_dirs=$cuda_dirs:$d; done
fi
export LD_LIBRARY_PATH=$cuda_dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

declare -a summary
failed=0
record() {  # step, status, detail
  summary+=("$(printf '%-10s %-5s %s' "$1" "$2" "$3")")
  [ "$2" = FAIL ] && failed=$((failed + 1))
}

step_env() {
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv || return 1
  for b in "$here"/bin/*; do
    echo "== $b"
    ldd "$b" | grep -E 'not found|cuda|cublas|nccl' || true
  done
  ! ldd "$here"/bin/* | grep -q 'not found'
}

step_tests() {
  local bad=0 total=0
  while read -r bin filt; do
    total=$((total + 1))
    echo "== $bin --gtest_filter=$filt"
    if ! (cd "$here" && "$here/bin/$bin" --gtest_filter="$filt" --gtest_also_run_disabled_tests \
      2>&1 | tee "$logs/test_$bin.log" | grep -E '^\[  (FAILED|SKIPPED|  OK) |^\[==========\]|PASSED|FAILED'); then
      :
    fi
    if ! grep -q '^\[  PASSED  \]' "$logs/test_$bin.log" || grep -q '^\[  FAILED  \]' "$logs/test_$bin.log"; then
      bad=$((bad + 1))
    fi
    if grep -q '^\[  SKIPPED \]' "$logs/test_$bin.log"; then
      echo "!! $bin skipped tests on a GPU machine"
      bad=$((bad + 1))
    fi
  done <"$here/gpu_tests.txt"
  echo "test binaries: $total, failing or skipping: $bad"
  [ "$bad" -eq 0 ]
}

# Greedy continuations of the CLI on the GPU against the Hugging Face goldens (token ids).
step_generate() {
  python3 - "$deja" "$here" "$dev" <<'EOF'
import json, subprocess, sys
deja, here, dev = sys.argv[1], sys.argv[2], sys.argv[3]
bad = 0
for m in ("opt-mini", "opt-tiny-postln"):
    cases = json.load(open(f"{here}/tests/golden/{m}/cases.json"))["cases"]
    for c in cases:
        want = c["greedy_ids"]
        # The checkpoint's dtypes, as the goldens' comparisons elsewhere (auto would pick bf16).
        out = subprocess.run([deja, "generate", "--device", dev, "--model", f"{here}/models/{m}",
                              "--dtype", "checkpoint", "--kv-dtype", "f32",
                              "--prompt", c["prompt"], "--max-new-tokens", str(len(want)),
                              "--ignore-eos", "--json"], capture_output=True, text=True)
        got = None
        if out.returncode == 0:
            got = json.loads(out.stdout.strip().splitlines()[-1])["token_ids"]
        ok = got == want
        bad += not ok
        print(f"{m} {c['name']}: {'same tokens' if ok else 'DIFFERENT'}"
              + ("" if ok else f" got {got} want {want} stderr {out.stderr[-500:]}"))
print(f"{bad} cases differ")
sys.exit(1 if bad else 0)
EOF
}

# serve on one GPU; on a machine with several, also --tp over all of them (up to 4, the fixture's
# heads allow 1, 2 or 4), NCCL between the ranks.
step_serve() {
  local gpus
  gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
  serve_once 1 || return 1
  if [ "$gpus" -ge 2 ]; then
    serve_once "$([ "$gpus" -ge 4 ] && echo 4 || echo 2)"
  else
    echo "one GPU: serve --tp > 1 (NCCL across GPUs) was not available"
  fi
}

serve_once() {
  local tp=$1 port=$((20000 + RANDOM % 20000)) pid rc
  echo "== serve --tp $tp"
  "$deja" serve --device "$dev" --tp "$tp" --model "$here/models/opt-mini" --port "$port" \
    --metrics-port -1 >"$logs/serve_tp$tp.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 240); do
    "$deja" client health --target "127.0.0.1:$port" >/dev/null 2>&1 && break
    sleep 0.5
  done
  "$deja" client generate --target "127.0.0.1:$port" --prompt "The quick brown fox" \
    --max-new-tokens 16
  rc=$?
  kill "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  tail -n 20 "$logs/serve_tp$tp.log"
  return $rc
}

step_bench() {
  local ckpt=/tmp/deja-opt-1.3b-random
  [ -f "$ckpt/config.json" ] || python3 "$here/tools/checkpoints/make_random_opt.py" --shape 1.3b \
    --out "$ckpt" --tokenizer "$here/models/opt-mini" || return 1
  "$deja" bench decode --device "$dev" --model "$ckpt" --dtype bf16 --batches 1,16,64 \
    --prefill-tokens 2048 --prompt-tokens 128 --decode-steps 32 --json | tee "$logs/bench_1.3b.json"
}

# Deja Vu on the GPU at the paper's operating point for OPT-175B-like layers (10% of neurons,
# 50% of heads, oracle selection: no predictor cost), dense vs sparse interleaved in one run, at
# batch 1 and 32, on the 6.7B and 13B shapes with as many layers as fit in half the GPU's memory.
step_dejavu() {
  local mem_mib shape hidden max_layers layers ckpt
  mem_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
  for shape in 6.7b 13b; do
    read -r hidden max_layers <<<"$([ $shape = 6.7b ] && echo 4096 32 || echo 5120 40)"
    # bf16 layer: 12 hidden^2 weights of 2 bytes, plus the transposed out_proj/fc2 (5 hidden^2).
    layers=$(python3 -c "print(min($max_layers, int($mem_mib * 2**20 * 0.5 // (17 * $hidden**2 * 2))))")
    ckpt=/tmp/deja-opt-$shape-$layers
    [ -f "$ckpt/config.json" ] || python3 "$here/tools/checkpoints/make_random_opt.py" \
      --shape $shape --layers "$layers" --out "$ckpt" --tokenizer "$here/models/opt-mini" ||
      return 1
    echo "== $shape shape, $layers layers"
    "$deja" bench decode --device "$dev" --model "$ckpt" --dtype bf16 --batches 1,32 \
      --prefill-tokens 128 --prompt-tokens 128 --decode-steps 32 --sparsity-oracle 0.1 \
      --mlp-fraction 0.1 --head-fraction 0.5 --kv-memory-fraction 0.3 --json | tee "$logs/dejavu_$shape.json" || return 1
  done
}

for s in $steps; do
  echo "=================== $s"
  start=$(date +%s)
  if "step_$s" >"$logs/$s.log" 2>&1; then st=PASS; else st=FAIL; fi
  tail -n 40 "$logs/$s.log"
  record "$s" "$st" "$(($(date +%s) - start)) s, log $logs/$s.log"
done
echo "=================== summary ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), $(date -u +%FT%TZ))"
printf '%s\n' "${summary[@]}"
exit $failed
