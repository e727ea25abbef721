#!/usr/bin/env bash
# Installs everything deja needs to build and test from Debian's packages (and numpy from PyPI
# for the checkpoint tools). Idempotent: does nothing when all packages are present.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libssl-dev openssl
  libgoogle-glog-dev libgflags-dev libgloo-dev libhwy-dev libre2-dev nlohmann-json3-dev
  libopenblas-dev libgtest-dev libgmock-dev libbenchmark-dev prometheus-cpp-dev
  # HTTP (http/): Boost.Beast and Asio, header-only.
  libboost-dev
  # The fuzz preset (scripts/fuzz.sh): clang with libFuzzer and the sanitizer runtimes, and
  # llvm-symbolizer for readable crash reports.
  clang libclang-rt-14-dev llvm
  python3 python3-venv python3-pip
  # tests/monitoring: promtool and a real Prometheus server.
  prometheus
  # tests/multihost: a lossy link between network namespaces where the kernel has no netem.
  iptables
  # tests/docs: the docs' curl commands (metrics scrapes) run as written.
  curl
)

# tests/deploy renders the manifests with `kubectl kustomize`: Debian's kubectl unless one is
# already installed.
command -v kubectl >/dev/null || PACKAGES+=(kubernetes-client)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  # The package starts a Prometheus server on :9090 where systemd runs, the port `deja serve`
  # exports its metrics on: the tests start their own server, so this one is stopped.
  if [[ " ${missing[*]} " == *" prometheus "* ]] && [ -d /run/systemd/system ]; then
    $SUDO systemctl disable --now prometheus >/dev/null 2>&1 || true
  fi
fi

# numpy for tools/checkpoints (random-weight benchmark checkpoints); grpcio and grpcio-tools for
# the Python client example and the test that compiles the public proto with them; PyYAML for
# tests/monitoring and tests/deploy; kubernetes-validate (the Kubernetes schemas, offline) and
# jsonschema for tests/deploy.
if ! python3 -c "import numpy, grpc, grpc_tools, yaml, kubernetes_validate, jsonschema" 2>/dev/null
then
  python3 -m pip install -q numpy grpcio grpcio-tools pyyaml kubernetes-validate jsonschema ||
    echo "note: a Python package did not install: tools/checkpoints, the Python proto tests," \
      "tests/monitoring and tests/deploy need them"
fi

# The test venvs (over the system's packages) of the third-party clients tests/openai drives the
# APIs with: .venv holds the official `openai` SDK, .venv-triton `tritonclient[grpc]` (apart: it
# pins a protobuf older than the grpcio-tools the other tests compile protos with).
root="$(cd "$(dirname "$0")/.." && pwd)"
venv_with() {  # venv_with DIR MODULE PACKAGE
  if ! "$1/bin/python3" -c "import $2" 2>/dev/null; then
    python3 -m venv --system-site-packages "$1" &&
      "$1/bin/python3" -m pip install -q "$3" ||
      echo "note: $3 did not install into $1: tests/openai needs it"
  fi
}
venv_with "$root/.venv" openai openai
venv_with "$root/.venv-triton" tritonclient.grpc "tritonclient[grpc]"
