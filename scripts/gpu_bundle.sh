#!/usr/bin/env bash
# Builds deja with CUDA and packs what a bare NVIDIA machine needs to run the GPU checks into one
# folder (default gpu-bundle/, and gpu-bundle.tar.xz beside it):
#   bin/      deja and every test binary with a `gpu` ctest label (stripped)
#   lib/      each shared library they load that such a machine lacks (found with ldd): gRPC,
#             protobuf, glog, gflags, Gloo, OpenBLAS, Highway, RE2, abseil, ... and libcudart.
#             Not packed: glibc's own libraries, the driver (libcuda) and cuBLAS/cuBLASLt/NCCL,
#             which every CUDA installation has (gpu_check.sh looks for them in the CUDA toolkit
#             and in the nvidia-* Python wheels); cuBLASLt alone is over 500 MB.
#   models/, tests/golden, tests/data: the fixtures the tests and checks read (the folder is the
#             tests' DEJA_SOURCE_DIR); tools/checkpoints/make_random_opt.py (numpy only)
#   gpu_check.sh, gpu_tests.txt (one line per test binary: binary and gtest filter)
# Usage: scripts/gpu_bundle.sh [OUT_DIR]. Then, on the GPU machine:
#   tar xf gpu-bundle.tar.xz && gpu-bundle/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
out=${1:-$root/gpu-bundle}
build=${DEJA_GPU_BUILD_DIR:-$root/build/release}

command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || {
  echo "gpu_bundle: no CUDA compiler (nvcc); install the CUDA toolkit first" >&2
  exit 1
}
export PATH=$PATH:/usr/local/cuda/bin
[ -f "$build/build.ninja" ] || cmake --preset release >/dev/null
if ! grep -q 'deja_kernels_cuda' "$build/build.ninja"; then
  echo "gpu_bundle: the build in $build has no CUDA backend (DEJA_WITH_CUDA off or no nvcc)" >&2
  exit 1
fi

# gtest_discover_tests lists a binary's cases only once it is built: build everything first (on
# a fresh build directory ctest would list no test at all).
# DEJA_GPU_BUNDLE_BUILD=0 packs the build as it is (the gpu tests of the binaries built so far).
[ "${DEJA_GPU_BUNDLE_BUILD:-1}" = 0 ] || cmake --build "$build" -j "$(nproc)"

# The gpu-labelled tests: binary -> gtest filter (their names joined with ':').
ctest --test-dir "$build" -L gpu --show-only=json-v1 >"$build/gpu_tests.json"
python3 - "$build/gpu_tests.json" "$build/gpu_tests.txt" <<'EOF'
import json, sys
tests = json.load(open(sys.argv[1]))["tests"]
by_bin = {}
for t in tests:
    cmd = t["command"]
    filt = next((a.split("=", 1)[1] for a in cmd[1:] if a.startswith("--gtest_filter=")), "*")
    by_bin.setdefault(cmd[0], []).append(filt)
with open(sys.argv[2], "w") as f:
    for b, filters in sorted(by_bin.items()):
        f.write(f"{b} {':'.join(filters)}\n")
EOF
mapfile -t test_bins < <(cut -d' ' -f1 "$build/gpu_tests.txt")
if [ ${#test_bins[@]} -eq 0 ]; then
  echo "gpu_bundle: ctest lists no gpu-labelled test in $build" >&2
  exit 1
fi

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/tests"
cp "$build/cli/deja" "$out/bin/"
for b in "${test_bins[@]}"; do cp "$b" "$out/bin/"; done
strip --strip-unneeded "$out"/bin/*
: >"$out/gpu_tests.txt"
while read -r b filt; do echo "$(basename "$b") $filt" >>"$out/gpu_tests.txt"; done <"$build/gpu_tests.txt"

# Shared libraries: everything ldd resolves except glibc and the CUDA libraries a CUDA machine has.
skip='^(libc|libm|libdl|librt|libpthread|libresolv|ld-linux-x86-64|libcuda|libcublas|libcublasLt|libnccl|linux-vdso)\.so'
for b in "$out"/bin/*; do
  ldd "$b" | awk '/=> \//{print $1, $3}'
done | sort -u | while read -r name path; do
  if [[ $name =~ $skip ]]; then continue; fi
  cp -L "$path" "$out/lib/$name"
done
strip --strip-unneeded "$out"/lib/*.so* 2>/dev/null || true

cp -r models "$out/models"
cp -r tests/golden tests/data "$out/tests/"
cp scripts/gpu_check.sh "$out/"
# The commit the bundle was built from ("+dirty" when the tree had uncommitted changes).
echo "$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo +dirty)" >"$out/COMMIT"
tools_needed=(tools/checkpoints/make_random_opt.py)
for t in "${tools_needed[@]}"; do
  [ -f "$t" ] && { mkdir -p "$out/$(dirname "$t")"; cp "$t" "$out/$t"; }
done
(cd "$out/.." && tar cJf "$(basename "$out").tar.xz" "$(basename "$out")")
echo "gpu_bundle: $(du -sh "$out" | cut -f1) in $out, $(du -sh "$out.tar.xz" | cut -f1) packed"
