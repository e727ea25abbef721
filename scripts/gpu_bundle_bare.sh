#!/usr/bin/env bash
# Runs the unpacked GPU bundle in a bare Debian root (debootstrap: the base system plus python3,
# numpy, xz and procps, none of deja's libraries; cuBLAS and NCCL as a CUDA machine has them) with DEJA_CHECK_DEVICE=cpu, to show that the
# bundle brings every library it needs and picks nothing up from this machine. Opt-in (needs root
# and a Debian mirror; a few minutes), not part of CI.
#   scripts/gpu_bundle_bare.sh [BUNDLE_TAR]   (default gpu-bundle.tar.xz; built first if missing)
# The check's summary.json and logs.tar.xz land in build/gpu-bundle-bare-out/.
set -euo pipefail
cd "$(dirname "$0")/.."
root_dir=$(pwd)
tarball=${1:-$root_dir/gpu-bundle.tar.xz}
[ -f "$tarball" ] || bash scripts/gpu_bundle.sh
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
command -v debootstrap >/dev/null || {
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends debootstrap
}
chroot_dir=${DEJA_BARE_ROOT:-/tmp/deja-bare-root}
if [ ! -x "$chroot_dir/usr/bin/python3" ]; then
  $SUDO rm -rf "$chroot_dir"
  $SUDO debootstrap --variant=minbase --include=python3,python3-numpy,xz-utils,procps \
    bookworm "$chroot_dir" "${DEJA_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
fi
# What every CUDA machine has and the bundle leaves out (cuBLAS, cuBLASLt, NCCL): from this
# machine's CUDA toolkit, where gpu_check.sh looks on a GPU machine. The driver (libcuda) stays
# out: the CUDA runtime opens it only when asked for a device.
cuda_lib=$(dirname "$(readlink -f /usr/local/cuda/lib64/libcublas.so)")
$SUDO mkdir -p "$chroot_dir/usr/local/cuda/lib64"
for l in libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
  src=$(readlink -f "$cuda_lib/$l" 2>/dev/null || ldconfig -p | awk -v l="$l" '$1 == l {print $NF; exit}')
  $SUDO cp -L "$src" "$chroot_dir/usr/local/cuda/lib64/$l"
done
$SUDO rm -rf "$chroot_dir/check"
$SUDO mkdir -p "$chroot_dir/check/out"
$SUDO tar xf "$tarball" -C "$chroot_dir/check"
mounted=0
cleanup() {
  if [ $mounted = 1 ]; then
    $SUDO umount "$chroot_dir/dev" 2>/dev/null || $SUDO umount -l "$chroot_dir/dev" 2>/dev/null
    $SUDO umount "$chroot_dir/proc" 2>/dev/null || $SUDO umount -l "$chroot_dir/proc" 2>/dev/null
  fi
  true
}
trap cleanup EXIT
$SUDO mount -t proc proc "$chroot_dir/proc"
$SUDO mount --bind /dev "$chroot_dir/dev"
mounted=1
# Nothing of deja's in the root: no grpc, glog or protobuf library outside the bundle.
if $SUDO chroot "$chroot_dir" sh -c 'ls /usr/lib/x86_64-linux-gnu | grep -E "libgrpc|libglog|libprotobuf|libgloo|libopenblas"'; then
  echo "gpu_bundle_bare: the bare root has deja's libraries" >&2
  exit 1
fi
rc=0
$SUDO chroot "$chroot_dir" env -i PATH=/usr/bin:/bin HOME=/root OUT=/check/out \
  DEJA_CHECK_DEVICE=cpu bash /check/gpu-bundle/gpu_check.sh || rc=$?
mkdir -p build/gpu-bundle-bare-out
cp "$chroot_dir"/check/out/* build/gpu-bundle-bare-out/
echo "gpu_bundle_bare: gpu_check.sh exited $rc; results in build/gpu-bundle-bare-out/"
exit $rc
