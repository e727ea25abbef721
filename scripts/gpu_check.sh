#!/usr/bin/env bash
# The GPU check: run from the folder scripts/gpu_bundle.sh makes, on a machine with an NVIDIA GPU,
# its driver and the CUDA 13 runtime libraries (cuBLAS, cuBLASLt, NCCL: from a CUDA toolkit or the
# nvidia-* Python wheels) and nothing else of deja's. One command, at most DEJA_CHECK_SECONDS
# (default 460) of wall time; each step has its own time cap and a failing step never stops the
# next. In the order of what they teach:
#   env       nvidia-smi, the libraries each binary resolves
#   tests     every test binary of the `gpu` ctest label (kernel comparisons first)
#   generate  `deja generate --device cuda` on both fixtures against the HF golden tokens
#   serve     `deja serve --device cuda`: greedy tokens equal the CPU's, a stream, a cancel
#   bench     `deja bench decode` on an OPT-1.3B-shaped random checkpoint (bf16)
#   dejavu    dense vs Deja Vu (oracle, 10% of neurons, 50% of heads), 6.7B and 13B shapes
#   peer      Hugging Face OPTForCausalLM (bf16, generate, greedy) on the same 1.3B checkpoint:
#             deja / HF per metric
#   sanitize  the failing test cases again under compute-sanitizer (memcheck; racecheck for the
#             attention and eviction kernels), so one run brings back enough to fix them
#   profile   (skipped where there is no ncu) Nsight Compute's kernel durations for batch-1
#             decode on the 1.3B shape, dense and Deja Vu, and batch-16 dense: per forward pass,
#             the launches, the GPU time they add up to and the kernels that take it
# Output: $OUT (or DEJA_CHECK_OUT, default ./gpu-check-out) receives exactly summary.json (each
# step's status, seconds and key figures, the GPU, its driver, the commit) and logs.tar.xz (every
# log); the last lines printed are a readable summary.
# DEJA_CHECK_STEPS="tests generate" runs a subset; DEJA_CHECK_DEVICE=cpu runs generate, serve,
# bench, dejavu and peer on the CPU with small shapes (to try the script without a GPU). Exit
# status: the number of failed steps.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
t0=$(date +%s)
budget=${DEJA_CHECK_SECONDS:-460}
dev=${DEJA_CHECK_DEVICE:-cuda}
steps=${DEJA_CHECK_STEPS:-env tests generate serve bench dejavu peer profile sanitize}
out=${OUT:-${DEJA_CHECK_OUT:-$here/gpu-check-out}}
work=$(mktemp -d /tmp/deja-gpu-check.XXXXXX)
logs=$work/logs
mkdir -p "$logs" "$out"
export DEJA_SOURCE_DIR=$here
py=python3

# CUDA libraries: the toolkit's, then the Python wheels' (nvidia/<lib>/lib or nvidia/cu13/lib).
cuda_dirs=$here/lib
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib \
  /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do
  [ -d "$d" ] && cuda_dirs=$cuda_dirs:$d
done
for d in $($py - <<'EOF' 2>/dev/null
import glob, os, site
roots = site.getsitepackages() + [site.getusersitepackages()]
for r in roots:
    for lib in sorted(glob.glob(os.path.join(r, "nvidia", "*", "lib"))):
        print(lib)
EOF
); do cuda_dirs=$cuda_dirs:$d; done
# Only deja's binaries see these folders: the bundle's libstdc++ (and the rest) must not reach
# python3, whose PyTorch needs its system's newer one.
libpath=$cuda_dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PATH=$PATH:/usr/local/cuda/bin
printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$libpath" "$here/bin/deja" >"$work/deja"
chmod +x "$work/deja"
deja=$work/deja

# Shapes: the 1.3B checkpoint for bench and peer, the Deja Vu shapes with a few layers (time,
# not memory, sizes them); on the CPU, small ones.
if [ "$dev" = cuda ]; then
  bench_shape=(1.3b 24) dv_shapes=("6.7b 8" "13b 6") bench_batches=1,16,64 prefill=2048
  steps_n=32
else
  bench_shape=(125m 2) dv_shapes=("125m 2") bench_batches=1,4 prefill=128 steps_n=8
fi
ckroot=/tmp/deja-check-models
mkdir -p "$ckroot"
ckpt_of() { echo "$ckroot/opt-$1-$2"; }
# The random checkpoints are written in the background while the tests run (numpy, one core each).
make_ckpt() {
  local dir
  dir=$(ckpt_of "$1" "$2")
  [ -f "$dir/config.json" ] && return 0
  $py "$here/tools/checkpoints/make_random_opt.py" --shape "$1" --layers "$2" --out "$dir.partial" \
    --tokenizer "$here/models/opt-mini" >"$logs/ckpt_$1_$2.log" 2>&1 && mv "$dir.partial" "$dir"
}
declare -A ckpt_pid
if [[ " $steps " =~ \ (bench|peer|dejavu|profile)\  ]]; then
  make_ckpt "${bench_shape[@]}" & ckpt_pid[${bench_shape[0]}]=$!
fi
if [[ " $steps " == *" dejavu "* ]]; then
  for s in "${dv_shapes[@]}"; do
    read -r sh ly <<<"$s"
    [ "$sh" = "${bench_shape[0]}" ] && continue
    make_ckpt "$sh" "$ly" & ckpt_pid[$sh]=$!
  done
fi
wait_ckpt() {  # shape layers: waits for its writer, fails if the checkpoint is missing
  local pid=${ckpt_pid[$1]:-}
  [ -n "$pid" ] && wait "$pid" 2>/dev/null
  [ -f "$(ckpt_of "$1" "$2")/config.json" ] || { echo "no checkpoint for $1 ($2 layers)"; cat "$logs/ckpt_$1_$2.log"; return 1; }
}

# Each step may write key figures as JSON to $figs/<step>.json.
figs=$work/figures
mkdir -p "$figs"

step_env() {
  if [ "$dev" = cuda ]; then
    nvidia-smi || return 1
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  fi
  echo "deja's LD_LIBRARY_PATH=$libpath"
  local missing=0
  for b in "$here"/bin/*; do
    echo "== $b"
    LD_LIBRARY_PATH=$libpath ldd "$b" | grep -E 'not found|cuda|cublas|nccl|libstdc|libgcc' || true
    LD_LIBRARY_PATH=$libpath ldd "$b" | grep -q 'not found' && missing=$((missing + 1))
  done
  $py - "$figs/env.json" "$missing" <<'EOF'
import json, subprocess, sys
f = {"binaries_with_missing_libraries": int(sys.argv[2])}
try:
    q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                        "--format=csv,noheader"], capture_output=True, text=True).stdout
    name, driver, mem = [x.strip() for x in q.splitlines()[0].split(",")]
    f.update(gpu=name, driver=driver, memory=mem)
except Exception as e:
    f["gpu"] = f"none ({type(e).__name__})"
try:
    import torch
    f["torch"] = torch.__version__
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        f["multiprocessors"] = p.multi_processor_count
except Exception:
    f["torch"] = None
json.dump(f, open(sys.argv[1], "w"))
EOF
  [ "$missing" -eq 0 ]
}

# Kernel comparisons first, then the model and engine tests.
step_tests() {
  local bad=0 total=0 failed_cases=0 skipped=0 unavailable=0 order
  order=$(grep -iE 'kernel' "$here/gpu_tests.txt"; grep -viE 'kernel' "$here/gpu_tests.txt")
  : >"$work/failed_cases.txt"
  : >"$work/skip_reasons.txt"
  while read -r bin filt; do
    [ -n "$bin" ] || continue
    total=$((total + 1))
    echo "== $bin --gtest_filter=$filt"
    (cd "$here" && LD_LIBRARY_PATH=$libpath timeout -k 5 "${tests_cap:-100}" "$here/bin/$bin" --gtest_filter="$filt" \
      --gtest_also_run_disabled_tests >"$logs/test_$bin.log" 2>&1)
    local rc=$?
    grep -E '^\[  (FAILED|SKIPPED) |^\[==========\]|^\[  PASSED' "$logs/test_$bin.log" | sort -u | head -30
    [ $rc -eq 124 ] && echo "!! $bin timed out"
    if ! grep -q '^\[  PASSED  \]' "$logs/test_$bin.log" || grep -q '^\[  FAILED  \]' "$logs/test_$bin.log"; then
      bad=$((bad + 1))
      tail -n 15 "$logs/test_$bin.log"
    fi
    local f
    f=$(grep -E '^\[  FAILED  \] [A-Za-z0-9_/.]+(, | \(|$)' "$logs/test_$bin.log" | awk '{print $4}' | sed 's/,$//' | sort -u)
    for c in $f; do echo "$bin $c" >>"$work/failed_cases.txt"; failed_cases=$((failed_cases + 1)); done
    # Skips: a case that does not apply to a device says why (kept in skip_reasons.txt); a skip
    # for want of CUDA on a GPU machine is a failure.
    local s
    s=$(grep -A1 ': Skipped$' "$logs/test_$bin.log" | grep -v -e ': Skipped$' -e '^--$' | sort | uniq -c)
    if [ -n "$s" ]; then
      echo "$s" | sed "s|^|$bin: |" >>"$work/skip_reasons.txt"
      skipped=$((skipped + $(echo "$s" | awk '{n += $1} END {print n}')))
      if grep -qE 'UNAVAILABLE|no CUDA device|without the CUDA backend|no usable CUDA' <<<"$s"; then
        unavailable=$((unavailable + 1))
        echo "!! $bin skipped for want of CUDA"
      fi
    fi
  done <<<"$order"
  local passed
  passed=$(cat "$logs"/test_*.log | grep -c '^\[       OK \]')
  echo "test binaries: $total, failing: $bad; cases passed $passed, failed $failed_cases, skipped $skipped"
  echo "skip reasons:"; cat "$work/skip_reasons.txt"; cp "$work/skip_reasons.txt" "$logs/"
  $py -c "import json,sys; json.dump(dict(binaries=$total, failing_binaries=$bad, cases_passed=$passed, cases_failed=$failed_cases, cases_skipped=$skipped, skipped_for_want_of_cuda=$unavailable), open(sys.argv[1],'w'))" "$figs/tests.json"
  [ "$bad" -eq 0 ] || return 1
  # Without a GPU every case skips for want of CUDA; with one, none may.
  [ "$dev" != cuda ] || [ "$unavailable" -eq 0 ]
}

# Greedy continuations of the CLI on the device against the Hugging Face goldens (token ids).
step_generate() {
  $py - "$deja" "$here" "$dev" "$figs/generate.json" <<'EOF'
import json, subprocess, sys
deja, here, dev, fig = sys.argv[1:5]
bad = total = 0
for m in ("opt-mini", "opt-tiny-postln"):
    cases = json.load(open(f"{here}/tests/golden/{m}/cases.json"))["cases"]
    for c in cases:
        want = c["greedy_ids"]
        total += 1
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
              + ("" if ok else f" got {got} want {want} stderr {out.stderr[-800:]}"))
print(f"{bad} of {total} cases differ")
json.dump({"cases": total, "differ": bad}, open(fig, "w"))
sys.exit(1 if bad else 0)
EOF
}

# serve on one device: greedy tokens and log-probs against `deja generate --device cpu`, a stream,
# a cancelled stream (the server keeps serving and frees the sequence). On a machine with several
# GPUs, also --tp over them (NCCL between the ranks).
step_serve() {
  local gpus=1 bad=0
  [ "$dev" = cuda ] && gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
  serve_once 1 || bad=1
  if [ "$gpus" -ge 2 ]; then
    serve_once "$([ "$gpus" -ge 4 ] && echo 4 || echo 2)" || bad=1
  else
    echo "one GPU: serve --tp > 1 (NCCL across GPUs) was not available"
  fi
  return $bad
}

serve_once() {
  local tp=$1 port=$((20000 + RANDOM % 20000)) pid rc=0 t
  t="127.0.0.1:$port"
  echo "== serve --tp $tp"
  "$deja" serve --device "$dev" --tp "$tp" --model "$here/models/opt-mini" --port "$port" \
    --dtype checkpoint --kv-dtype f32 --metrics-port -1 --http-port -1 >"$logs/serve_tp$tp.log" 2>&1 &
  pid=$!
  local up=0
  for _ in $(seq 1 120); do
    "$deja" client health --target "$t" >/dev/null 2>&1 && { up=1; break; }
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.5
  done
  if [ $up -eq 0 ]; then
    echo "server did not come up"; tail -n 30 "$logs/serve_tp$tp.log"
    kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; return 1
  fi
  $py - "$deja" "$t" "$here" "$figs/serve_tp$tp.json" <<'EOF' || rc=1
import json, subprocess, sys, time
deja, target, here, fig = sys.argv[1:5]
model = f"{here}/models/opt-mini"
prompts = ["The quick brown fox", "Once upon a time there was", "And God said"]
f = {"greedy_same": 0, "greedy_cases": len(prompts), "max_logprob_diff": 0.0}
ok = True
for p in prompts:
    cpu = subprocess.run([deja, "generate", "--device", "cpu", "--model", model, "--prompt", p,
                          "--dtype", "checkpoint", "--kv-dtype", "f32",
                          "--max-new-tokens", "24", "--ignore-eos", "--json"],
                         capture_output=True, text=True)
    srv = subprocess.run([deja, "client", "generate", "--target", target, "--prompt", p,
                          "--max-new-tokens", "24", "--ignore-eos", "--logprobs", "--json"],
                         capture_output=True, text=True)
    if cpu.returncode or srv.returncode:
        print(f"{p!r}: cpu rc {cpu.returncode} {cpu.stderr[-400:]} server rc {srv.returncode} {srv.stderr[-400:]}")
        ok = False
        continue
    c = json.loads(cpu.stdout.strip().splitlines()[-1])
    s = json.loads(srv.stdout.strip().splitlines()[-1])
    sid = [t.get("id", 0) for t in s.get("tokens", [])]
    slp = [t.get("logprob", 0.0) for t in s.get("tokens", [])]
    same = sid == c["token_ids"]
    diff = max((abs(a - b) for a, b in zip(slp, c["logprobs"])), default=0.0)
    f["max_logprob_diff"] = max(f["max_logprob_diff"], diff)
    f["greedy_same"] += same
    ok &= same
    print(f"{p!r}: {'same tokens' if same else 'DIFFERENT'}, max |logprob diff| {diff:.2e}"
          + ("" if same else f"\n  cpu {c['token_ids']}\n  srv {sid}"))
# A stream: text arrives in several messages and ends with finished=true.
st = subprocess.run([deja, "client", "stream", "--target", target, "--prompt", prompts[0],
                     "--max-new-tokens", "32", "--ignore-eos", "--json"], capture_output=True, text=True)
msgs = [json.loads(l) for l in st.stdout.splitlines() if l.startswith("{")]
f["stream_messages"] = len(msgs)
stream_ok = st.returncode == 0 and len(msgs) >= 2 and msgs[-1].get("finished") is True
print(f"stream: rc {st.returncode}, {len(msgs)} messages, finished {msgs[-1].get('finished') if msgs else None}")
ok &= stream_ok
# A cancelled stream: Cancel by request id once the first tokens arrived; the stream ends
# cancelled well before its 1000 tokens and the server answers the next request.
p = subprocess.Popen([deja, "client", "stream", "--target", target, "--prompt", prompts[1],
                      "--max-new-tokens", "1000", "--ignore-eos", "--request-id", "check-cancel",
                      "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
first = p.stdout.readline()
cancel = subprocess.run([deja, "client", "cancel", "--target", target, "--request-id", "check-cancel"],
                        capture_output=True, text=True)
try:
    rest, err = p.communicate(timeout=20)
except subprocess.TimeoutExpired:
    p.kill()
    rest, err = p.communicate()
lines = [json.loads(l) for l in (first + rest).splitlines() if l.startswith("{")]
last = lines[-1] if lines else {}
generated = last.get("generated_tokens", last.get("generatedTokens"))
reason = str(last.get("finish_reason", last.get("finishReason", "")))
cancelled = "CANCEL" in reason.upper() or "CANCEL" in err.upper()
after = subprocess.run([deja, "client", "generate", "--target", target, "--prompt", prompts[2],
                        "--max-new-tokens", "8"], capture_output=True, text=True)
f["cancel"] = cancel.stdout.strip()
f["cancelled_after_tokens"] = generated
f["cancel_finish"] = reason or err.strip()[-120:]
f["serves_after_cancel"] = after.returncode == 0
print(f"cancel: {cancel.stdout.strip()} {cancel.stderr.strip()[-200:]}; stream rc {p.returncode}, "
      f"finish {reason or err.strip()[-200:]}, {generated} tokens; next request rc {after.returncode}")
ok &= cancelled and cancel.stdout.strip() == "cancelled" and after.returncode == 0
json.dump(f, open(fig, "w"))
sys.exit(0 if ok else 1)
EOF
  kill "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  tail -n 15 "$logs/serve_tp$tp.log"
  return $rc
}

step_bench() {
  wait_ckpt "${bench_shape[@]}" || return 1
  "$deja" bench decode --device "$dev" --model "$(ckpt_of "${bench_shape[@]}")" --dtype bf16 \
    --batches "$bench_batches" --prefill-tokens "$prefill" --prompt-tokens 128 \
    --decode-steps "$steps_n" --json >"$logs/bench.json" || return 1
  # The same decode steps with one KV write and attention per sequence (the path before
  # DecodeAttention), for the batched path's gain.
  "$deja" bench decode --device "$dev" --model "$(ckpt_of "${bench_shape[@]}")" --dtype bf16 \
    --batches "$bench_batches" --prefill-tokens 16 --prompt-tokens 128 \
    --decode-steps "$steps_n" --decode-attention per-sequence --json \
    >"$logs/bench_per_sequence.json" || true
  # And with every kernel launched (no CUDA graphs), for the graphs' gain.
  "$deja" bench decode --device "$dev" --model "$(ckpt_of "${bench_shape[@]}")" --dtype bf16 \
    --batches "$bench_batches" --prefill-tokens 16 --prompt-tokens 128 \
    --decode-steps "$steps_n" --cuda-graphs off --json \
    >"$logs/bench_eager.json" || true
  $py - "$logs/bench.json" "$figs/bench.json" "$logs/bench_per_sequence.json" \
    "$logs/bench_eager.json" <<'EOF'
import json, os, sys
j = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
per_seq, eager = {}, {}
if os.path.getsize(sys.argv[3]) > 0:
    for d in json.loads(open(sys.argv[3]).read().strip().splitlines()[-1])["decode"]:
        per_seq[d["batch"]] = d["ms_per_step"]
if os.path.getsize(sys.argv[4]) > 0:
    for d in json.loads(open(sys.argv[4]).read().strip().splitlines()[-1])["decode"]:
        eager[d["batch"]] = d["ms_per_step"]
f = {k: j.get(k) for k in ("model", "device", "weight_bytes", "device_copy_gb_per_s",
                           "device_bf16_gemm_tflop_per_s", "floor_ms_per_token",
                           "batch1_fraction_of_floor", "prefill_tokens", "prefill_tokens_per_s",
                           "prefill_fraction_of_compute_peak")}
for d in j["decode"]:
    f[f"batch{d['batch']}_ms_per_step"] = d["ms_per_step"]
    f[f"batch{d['batch']}_tokens_per_s"] = d["tokens_per_s"]
    f[f"batch{d['batch']}_speedup_vs_batch1"] = d.get("speedup_vs_batch1")
    if d["batch"] in per_seq:
        f[f"batch{d['batch']}_per_sequence_attention_ms_per_step"] = per_seq[d["batch"]]
        f[f"batch{d['batch']}_batched_vs_per_sequence"] = per_seq[d["batch"]] / d["ms_per_step"]
    if d["batch"] in eager:
        f[f"batch{d['batch']}_eager_ms_per_step"] = eager[d["batch"]]
        f[f"batch{d['batch']}_graphs_vs_eager"] = eager[d["batch"]] / d["ms_per_step"]
json.dump(f, open(sys.argv[2], "w"))
print(json.dumps(f, indent=1))
EOF
}

# Deja Vu at the paper's operating point for OPT-175B-like layers (10% of neurons, 50% of heads,
# oracle selection: no predictor cost), dense and sparse steps interleaved in one run.
step_dejavu() {
  local bad=0 sh ly
  for s in "${dv_shapes[@]}"; do
    read -r sh ly <<<"$s"
    wait_ckpt "$sh" "$ly" || { bad=1; continue; }
    echo "== $sh shape, $ly layers"
    "$deja" bench decode --device "$dev" --model "$(ckpt_of "$sh" "$ly")" --dtype bf16 \
      --batches 1,32 --prefill-tokens 128 --prompt-tokens 128 --decode-steps "$steps_n" \
      --sparsity-oracle 0.1 --mlp-fraction 0.1 --head-fraction 0.5 --kv-memory-fraction 0.3 \
      --json >"$logs/dejavu_$sh.json" || { bad=1; continue; }
  done
  $py - "$figs/dejavu.json" "$logs"/dejavu_*.json <<'EOF'
import json, sys
f = {}
for p in sys.argv[2:]:
    try:
        j = json.loads(open(p).read().strip().splitlines()[-1])
    except Exception:
        continue
    shape = p.rsplit("dejavu_", 1)[1][:-5]
    for d in j["decode"]:
        f[f"{shape}_batch{d['batch']}_dense_ms"] = d["ms_per_step"]
        if "sparse" in d:
            f[f"{shape}_batch{d['batch']}_sparse_ms"] = d["sparse"]["ms_per_step"]
            f[f"{shape}_batch{d['batch']}_speedup"] = d["sparse"]["speedup_vs_dense"]
json.dump(f, open(sys.argv[1], "w"))
print(json.dumps(f, indent=1))
EOF
  return $bad
}

# Hugging Face transformers on the same checkpoint and device, bf16, greedy generate (a static
# cache where the model takes one): decode ms/step at batch 1 and 16 from (generate 1+N tokens -
# generate 1 token) / N, prefill tokens/s from a forward pass of the bench's prefill length.
step_peer() {
  $py -c "import torch, transformers" 2>/dev/null || { echo "no torch/transformers here"; return 77; }
  wait_ckpt "${bench_shape[@]}" || return 1
  $py - "$(ckpt_of "${bench_shape[@]}")" "$dev" "$prefill" "$steps_n" "$figs/bench.json" \
    "$figs/peer.json" <<'EOF'
import json, statistics, sys, time
ckpt, dev, prefill, steps, bench_fig, fig = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
import torch, transformers
from transformers import OPTForCausalLM
f = {"transformers": transformers.__version__, "torch": torch.__version__}
device = "cuda" if dev == "cuda" else "cpu"
model = OPTForCausalLM.from_pretrained(ckpt, dtype=torch.bfloat16).to(device).eval()
g = torch.Generator().manual_seed(1)
def sync():
    if device == "cuda":
        torch.cuda.synchronize()
def gen(ids, n, cache):
    kw = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=1)
    if cache:
        kw["cache_implementation"] = cache
    sync(); t = time.perf_counter()
    with torch.no_grad():
        model.generate(ids, attention_mask=torch.ones_like(ids), **kw)
    sync()
    return time.perf_counter() - t
def save():
    try:
        d = json.load(open(bench_fig))
    except FileNotFoundError:
        d = {}
    for k in [k for k in f if k.endswith("_ms_per_step")]:
        mine = d.get(k.replace("static_", ""))  # deja's figure at that batch
        if mine:
            f[f"deja_over_hf_{k[:-len('_ms_per_step')]}_speed"] = f[k] / mine
    if d.get("prefill_tokens_per_s") and f.get("prefill_tokens_per_s"):
        f["deja_over_hf_prefill_speed"] = d["prefill_tokens_per_s"] / f["prefill_tokens_per_s"]
    json.dump(f, open(fig, "w"))
def decode_ms(b, cache):
    ids = torch.randint(4, 8000, (b, 128), generator=g).to(device)
    gen(ids, steps + 1, cache); gen(ids, 1, cache)  # warm-up (and a static cache's compile)
    t_full = statistics.median(gen(ids, steps + 1, cache) for _ in range(3))
    t_one = statistics.median(gen(ids, 1, cache) for _ in range(3))
    return (t_full - t_one) / steps * 1e3
# The dynamic cache (eager) at both batches, then prefill; then, while the step's time lasts, a
# static cache at batch 1 (generate compiles it per shape: slow to start).
f["cache"] = "dynamic"
for b in (1, 16) if dev == "cuda" else (1, 4):
    f[f"batch{b}_ms_per_step"] = decode_ms(b, None)
    print(f"HF batch {b}: {f[f'batch{b}_ms_per_step']:.3f} ms/step (dynamic cache)", flush=True)
    save()
ids = torch.randint(4, 8000, (1, prefill), generator=g).to(device)
with torch.no_grad():
    model(ids); sync()
    ts = []
    for _ in range(3):
        t = time.perf_counter(); model(ids); sync(); ts.append(time.perf_counter() - t)
f["prefill_tokens_per_s"] = prefill / statistics.median(ts)
print(f"HF prefill {prefill} tokens: {f['prefill_tokens_per_s']:.0f} tokens/s", flush=True)
save()
try:
    f["static_batch1_ms_per_step"] = decode_ms(1, "static")
    print(f"HF batch 1: {f['static_batch1_ms_per_step']:.3f} ms/step (static cache)", flush=True)
except Exception as e:
    print(f"static cache refused ({type(e).__name__}: {str(e)[:200]})")
save()
json.dump(f, open(fig, "w"))
print(json.dumps(f, indent=1))
EOF
}

# Nsight Compute's duration of every kernel of short bench runs (batch 1 dense and Deja Vu, batch
# 16 dense), in their timed decode steps only (--profile-decode-only opens the capture range
# there: no prompt prefills). No clock control: the clocks stay as they are. Application replay
# and a small KV pool: no device memory is saved and restored around a kernel. A forward pass
# starts at its embedding kernel; per pass shape (its launch count), the median GPU time and the
# kernels that take it, beside the bench's own ms/step.
step_profile() {
  local ncu
  ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  [ -n "$ncu" ] && [ -x "$ncu" ] || { echo "no ncu"; return 77; }
  wait_ckpt "${bench_shape[@]}" || return 1
  local bad=0
  run_ncu() {  # name, then the bench's flags
    local name=$1
    shift
    local flags=(bench decode --device "$dev" --dtype bf16 --batches 1 --prefill-tokens 64
      --prompt-tokens 64 --decode-steps 6 --warmup-rounds 1 --kv-memory-fraction 0.05
      --profile-decode-only "$@")
    "$deja" "${flags[@]}" --json >"$logs/profile_${name}_bench.json" 2>/dev/null
    LD_LIBRARY_PATH=$libpath timeout -k 5 70 "$ncu" --clock-control none --target-processes all \
      --replay-mode application --cache-control none --metrics gpu__time_duration.sum --csv \
      --profile-from-start off \
      --print-units base --launch-count 6000 \
      "$here/bin/deja" "${flags[@]}" >"$logs/profile_$name.csv" 2>"$logs/profile_$name.err"
  }
  local m
  m=$(ckpt_of "${bench_shape[@]}")
  run_ncu "dense_${bench_shape[0]}" --model "$m" || bad=1
  run_ncu "dejavu_${bench_shape[0]}" --model "$m" --sparsity-oracle 0.1 --mlp-fraction 0.1 \
    --head-fraction 0.5 || bad=1
  run_ncu "dense16_${bench_shape[0]}" --model "$m" --batches 16 || bad=1
  $py - "$logs" "$figs/profile.json" <<'EOF' || bad=1
import csv, glob, json, os, re, statistics, sys
logs, fig = sys.argv[1:3]
f = {}
for path in sorted(glob.glob(os.path.join(logs, "profile_*.csv"))):
    name = os.path.basename(path)[len("profile_"):-4]
    rows = list(csv.reader(l for l in open(path) if l.startswith('"')))
    if not rows:
        print(name, "no kernels")
        f[name + "_kernels"] = 0
        continue
    h = rows[0]
    ki, mi, vi = h.index("Kernel Name"), h.index("Metric Name"), h.index("Metric Value")
    def short(k):  # "void deja::<unnamed>::AddKernel(const float *, ...)" -> "deja::AddKernel"
        for x in ("<unnamed>::", "(anonymous namespace)::", "void "):
            k = k.replace(x, "")
        return re.sub(r"[(<].*", "", k)[:60]
    ks = [(short(r[ki]), float(r[vi].replace(",", "")) / 1e3) for r in rows[1:]
          if r[mi] == "gpu__time_duration.sum"]
    passes, cur = [], None
    for k, us in ks:
        if "EmbeddingKernel" in k:
            cur = []
            passes.append(cur)
        if cur is not None:
            cur.append((k, us))
    try:
        b = json.loads(open(os.path.join(logs, f"profile_{name}_bench.json")).read().strip().splitlines()[-1])
        d = b["decode"][0]
        f[name + "_bench_ms_per_step"] = d["ms_per_step"]
        if "sparse" in d:
            f[name + "_bench_sparse_ms_per_step"] = d["sparse"]["ms_per_step"]
    except Exception as e:
        print(name, "bench figures unreadable:", e)
    f[name + "_kernels"] = len(ks)
    f[name + "_passes"] = len(passes)
    by_len = {}
    for p in passes[1:-1]:  # the first pass is a prefill, the last one cut by the launch count
        by_len.setdefault(len(p), []).append(p)
    for n, ps in sorted(by_len.items()):
        if len(ps) < 2:
            continue  # prefills
        tot = statistics.median(sum(us for _, us in p) for p in ps)
        f[f"{name}_pass{n}_count"] = len(ps)
        f[f"{name}_pass{n}_gpu_ms"] = round(tot / 1e3, 4)
        agg = {}
        for p in ps:
            for k, us in p:
                a = agg.setdefault(k, [0, 0.0])
                a[0] += 1
                a[1] += us
        print(f"== {name}: {len(ps)} passes of {n} launches, median GPU time {tot / 1e3:.3f} ms")
        for k, (c, us) in sorted(agg.items(), key=lambda x: -x[1][1])[:14]:
            print(f"   {us / len(ps):9.1f} us/pass {c // len(ps):5d} launches/pass {us / c:8.2f} us each  {k}")
json.dump(f, open(fig, "w"))
EOF
  tail -n 5 "$logs"/profile_*.err
  return $bad
}

# The failing cases of the tests step once more under compute-sanitizer: memcheck for every one,
# racecheck too for the attention and eviction kernels.
step_sanitize() {
  local cs
  cs=$(command -v compute-sanitizer) || { echo "no compute-sanitizer"; return 77; }
  [ -s "$work/failed_cases.txt" ] || { echo "no failing test cases"; return 77; }
  local bin cases n=0
  for bin in $(cut -d' ' -f1 "$work/failed_cases.txt" | sort -u); do
    cases=$(awk -v b="$bin" '$1 == b {print $2}' "$work/failed_cases.txt" | head -8 | paste -sd:)
    echo "== memcheck $bin --gtest_filter=$cases"
    (cd "$here" && LD_LIBRARY_PATH=$libpath timeout -k 5 "${sanitize_cap:-60}" "$cs" --tool memcheck --print-limit 50 \
      "$here/bin/$bin" --gtest_filter="$cases" >"$logs/sanitize_memcheck_$bin.log" 2>&1)
    grep -E 'ERROR SUMMARY|Invalid|out of bounds|FAILED' "$logs/sanitize_memcheck_$bin.log" | head -20
    if grep -qiE 'attention|evict|kv' <<<"$cases"; then
      local rc
      rc=$(grep -iE 'attention|evict|kv' <<<"${cases//:/$'\n'}" | head -4 | paste -sd:)
      echo "== racecheck $bin --gtest_filter=$rc"
      (cd "$here" && LD_LIBRARY_PATH=$libpath timeout -k 5 "${sanitize_cap:-60}" "$cs" --tool racecheck --print-limit 50 \
        "$here/bin/$bin" --gtest_filter="$rc" >"$logs/sanitize_racecheck_$bin.log" 2>&1)
      grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|hazard' "$logs/sanitize_racecheck_$bin.log" | head -10
    fi
    n=$((n + 1))
  done
  $py -c "import json,sys; json.dump(dict(binaries_rerun=$n), open(sys.argv[1],'w'))" "$figs/sanitize.json"
}

# Each step gets at most its cap and never more than what is left of the budget (30 s are kept
# for the summary and the log archive).
declare -A cap=([env]=20 [tests]=150 [generate]=30 [serve]=45 [bench]=60 [dejavu]=70 [peer]=80
  [sanitize]=120 [profile]=230)
declare -A status secs
for s in $steps; do
  left=$((budget - 30 - ($(date +%s) - t0)))
  c=${cap[$s]:-60}
  [ "$c" -gt "$left" ] && c=$left
  echo "=================== $s (cap ${c} s)"
  start=$(date +%s)
  if [ "$c" -lt 5 ]; then
    status[$s]=NOTIME
    echo "no time left"
  else
    tests_cap=$((c > 100 ? 100 : c)) sanitize_cap=$((c / 2 > 60 ? 60 : c / 2))
    # Its own process group (job control on), so the cap stops everything the step started.
    set -m
    ( "step_$s" ) >"$logs/$s.log" 2>&1 &
    spid=$!
    set +m
    # (Its output goes nowhere: a sleep holding this script's stdout would keep a pipe open.)
    ( sleep "$c"; kill -TERM -- "-$spid"; sleep 3; kill -KILL -- "-$spid" ) >/dev/null 2>&1 &
    wpid=$!
    wait "$spid"
    rc=$?
    pkill -P "$wpid" 2>/dev/null
    kill "$wpid" 2>/dev/null
    wait "$wpid" 2>/dev/null
    kill -KILL -- "-$spid" 2>/dev/null  # whatever the step left running (a server)
    if [ $(($(date +%s) - start)) -ge "$c" ] && [ $rc -ne 0 ]; then status[$s]=TIMEOUT
    elif [ $rc -eq 0 ]; then status[$s]=PASS
    elif [ $rc -eq 77 ]; then status[$s]=SKIP
    else status[$s]=FAIL; fi
    tail -n 12 "$logs/$s.log"
  fi
  secs[$s]=$(($(date +%s) - start))
done
# Leftover background writers and servers go; their logs stay.
jobs -p | xargs -r kill 2>/dev/null
pkill -f "$here/bin/deja" 2>/dev/null

commit=$(cat "$here/COMMIT" 2>/dev/null || echo unknown)
for s in $steps; do echo "$s ${status[$s]} ${secs[$s]}"; done >"$work/steps.txt"
$py - "$work/steps.txt" "$figs" "$out/summary.json" "$commit" "$dev" "$(($(date +%s) - t0))" <<'EOF'
import json, os, sys, datetime
steps_txt, figs, dst, commit, dev, total = sys.argv[1:7]
steps = []
for line in open(steps_txt):
    name, st, secs = line.split()
    figures = {}
    for fn in sorted(os.listdir(figs)):
        if fn == name + ".json" or fn.startswith(name + "_"):
            try:
                figures.update(json.load(open(os.path.join(figs, fn))))
            except Exception as e:
                figures[fn] = f"unreadable: {e}"
    steps.append({"step": name, "status": st, "seconds": int(secs), "figures": figures})
env = next((s["figures"] for s in steps if s["step"] == "env"), {})
summary = {"commit": commit, "device": dev, "gpu": env.get("gpu"), "driver": env.get("driver"),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "total_seconds": int(total), "steps": steps}
json.dump(summary, open(dst, "w"), indent=1)
print(f"=================== summary: {summary['gpu']} driver {summary['driver']}, commit {commit}, "
      f"{total} s")
import textwrap
for s in steps:
    print(f"{s['step']:<9} {s['status']:<7} {s['seconds']:>4} s")
    parts = [f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in s["figures"].items()]
    for line in textwrap.wrap(", ".join(parts), 110):
        print("    " + line)
EOF
tar cJf "$out/logs.tar.xz" -C "$work" logs figures 2>/dev/null
rm -rf "$work"
failed=0
for s in $steps; do [[ ${status[$s]} =~ PASS|SKIP ]] || failed=$((failed + 1)); done
echo "failed steps: $failed; $out: $(ls "$out" | paste -sd' ')"
exit $failed
