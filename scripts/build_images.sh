#!/usr/bin/env bash
# Builds the container images without a container daemon (opt-in; CI does not run it): Debian's
# buildah with chroot isolation and vfs storage, over a Debian base image made here with
# debootstrap (no image registry is reachable), then runs the `cpu` image's `deja serve` from the
# image's root filesystem and answers one request through each API (deja.v1 gRPC, the OpenAI
# HTTP API, KServe v2). Prints each image's size and how long each step took.
#   bash scripts/build_images.sh [cpu|cuda ...]     (default: cpu)
# Needs root (debootstrap, buildah's chroot) and the network to Debian's mirror and PyPI, as the
# Dockerfiles' own build stages do. Work files: build/images/ (the base root filesystem) and
# buildah's storage under build/images/storage.
set -euo pipefail
cd "$(dirname "$0")/.."
variants=("$@")
[ ${#variants[@]} -eq 0 ] && variants=(cpu)
work=$PWD/build/images
mkdir -p "$work"
storage=(--storage-driver vfs --root "$work/storage" --runroot "$work/run")
t() { date +%s; }
start=$(t)

for p in buildah debootstrap; do
  command -v "$p" >/dev/null || { apt-get update -qq && apt-get install -y -qq "$p"; }
done

# The base: Debian bookworm from its mirror, as both tags the Dockerfiles name.
if ! buildah "${storage[@]}" inspect --type image debian:bookworm >/dev/null 2>&1; then
  s=$(t)
  rm -rf "$work/rootfs"
  debootstrap --variant=minbase bookworm "$work/rootfs" http://deb.debian.org/debian >"$work/debootstrap.log"
  ctr=$(buildah "${storage[@]}" from scratch)
  mnt=$(buildah "${storage[@]}" mount "$ctr")
  cp -a "$work/rootfs/." "$mnt/"
  buildah "${storage[@]}" umount "$ctr"
  buildah "${storage[@]}" commit -q "$ctr" debian:bookworm >/dev/null
  buildah "${storage[@]}" rm "$ctr" >/dev/null
  buildah "${storage[@]}" tag debian:bookworm debian:bookworm-slim
  echo "build_images: base image (debootstrap minbase bookworm) in $(($(t) - s)) s"
fi

for v in "${variants[@]}"; do
  s=$(t)
  buildah "${storage[@]}" bud --isolation chroot --layers -f "Dockerfile.$v" -t "deja-$v" . \
    >"$work/build-$v.log" 2>&1 || { tail -40 "$work/build-$v.log"; exit 1; }
  size=$(buildah "${storage[@]}" images --format '{{.Size}}' "deja-$v" | head -1)
  echo "build_images: deja-$v built in $(($(t) - s)) s, $size (log: $work/build-$v.log)"
done

# The cpu image's server, run from its root filesystem (the image's CMD, on free ports), and
# one request through each API from this host.
if [[ " ${variants[*]} " == *" cpu "* ]]; then
  ctr=$(buildah "${storage[@]}" from deja-cpu)
  mnt=$(buildah "${storage[@]}" mount "$ctr")
  trap 'kill $serve 2>/dev/null || true; buildah "${storage[@]}" umount "$ctr" >/dev/null; buildah "${storage[@]}" rm "$ctr" >/dev/null' EXIT
  free() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
  port=$(free) http=$(free) metrics=$(free)
  mkdir -p "$mnt/proc" "$mnt/dev" "$mnt/tmp"
  mount -t proc proc "$mnt/proc"
  mount --rbind /dev "$mnt/dev"
  chroot --userspec=10001:10001 "$mnt" /usr/local/bin/deja serve --model /opt/deja/models/opt-mini \
    --host 127.0.0.1 --port "$port" --http-port "$http" --metrics-port "$metrics" \
    >"$work/serve-cpu.log" 2>&1 &
  serve=$!
  trap 'kill $serve 2>/dev/null || true; sleep 1; umount "$mnt/proc"; umount -R "$mnt/dev" || true; buildah "${storage[@]}" umount "$ctr" >/dev/null; buildah "${storage[@]}" rm "$ctr" >/dev/null' EXIT
  for _ in $(seq 240); do
    grep -q "deja: ready" "$work/serve-cpu.log" && break
    sleep 0.5
  done
  grep -q "deja: ready" "$work/serve-cpu.log" || { tail -20 "$work/serve-cpu.log"; exit 1; }
  DEJA=${DEJA:-build/release/cli/deja}
  echo "build_images: gRPC:   $("$DEJA" client generate --target "127.0.0.1:$port" --prompt 'And God said' --max-new-tokens 8)"
  echo "build_images: OpenAI: $(curl -s "127.0.0.1:$http/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt": "And God said", "max_tokens": 8, "temperature": 0}')"
  echo "build_images: KServe: $(.venv-triton/bin/python3 - "$port" <<'EOF'
import sys
import numpy as np
import tritonclient.grpc as tc
c = tc.InferenceServerClient(f"127.0.0.1:{sys.argv[1]}")
t = tc.InferInput("text_input", [1], "BYTES")
t.set_data_from_numpy(np.array([b"And God said"], dtype=np.object_))
m = tc.InferInput("max_tokens", [1], "INT32")
m.set_data_from_numpy(np.array([8], dtype=np.int32))
print(c.infer("opt-mini", [t, m]).as_numpy("text_output")[0].decode())
EOF
)"
fi
echo "build_images: done in $(($(t) - start)) s"
