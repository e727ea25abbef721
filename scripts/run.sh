#!/usr/bin/env bash
# The main job: install dependencies, build, and serve the bundled models/opt-mini with two
# tensor-parallel CPU workers (gRPC on 127.0.0.1:50051, the OpenAI-compatible HTTP API on :8000,
# Prometheus /metrics on :9090; pass
# --host 0.0.0.0, with TLS and tokens, to serve other hosts: docs/serving.md#security). Its
# Deja Vu predictors are loaded with sparsity off by default: on a model this small the dense
# step is faster (docs/performance.md); requests opt in with Sparsity.mode = MODE_ON.
#
# It builds only what serving needs (the `serve` preset: the deja binary in build/serve, no tests
# or benchmarks), and the CUDA backend only where nvidia-smi sees a GPU (DEJA_WITH_CUDA=ON|OFF
# decides instead). scripts/test.sh builds everything (build/release).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
bash scripts/install_deps.sh
cuda=OFF
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then cuda=ON; fi
cmake --preset serve -DDEJA_WITH_CUDA="${DEJA_WITH_CUDA:-$cuda}" >/dev/null
cmake --build --preset serve -j "$(nproc)"
DEJA=./build/serve/cli/deja
echo "run.sh: installed and built in $(($(date +%s) - start)) s"
PORT=${DEJA_PORT:-50051}
METRICS_PORT=${DEJA_METRICS_PORT:-9090}
HTTP_PORT=${DEJA_HTTP_PORT:-8000}
# The banner names the ports the server will use: --port / --metrics-port / --http-port given
# here win.
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[i]}" in
    --port=*) PORT=${args[i]#--port=} ;;
    --metrics-port=*) METRICS_PORT=${args[i]#--metrics-port=} ;;
    --port) PORT=${args[i + 1]:-$PORT} ;;
    --metrics-port) METRICS_PORT=${args[i + 1]:-$METRICS_PORT} ;;
    --http-port=*) HTTP_PORT=${args[i]#--http-port=} ;;
    --http-port) HTTP_PORT=${args[i + 1]:-$HTTP_PORT} ;;
  esac
done
cat <<MSG
Starting deja serve on models/opt-mini (tp=2). When it logs that it is ready, in another shell:
  $DEJA client stream --target 127.0.0.1:$PORT --prompt "And God said" --max-new-tokens 32
  $DEJA client stream --target 127.0.0.1:$PORT --prompt "And God said" --max-new-tokens 32 --sparsity on
  $DEJA client health --target 127.0.0.1:$PORT --service deja.v1.TextGeneration
  curl -sN 127.0.0.1:$HTTP_PORT/v1/completions -H 'Content-Type: application/json' \
    -d '{"prompt": "And God said", "max_tokens": 32, "temperature": 0, "stream": true}'
  curl -s 127.0.0.1:$METRICS_PORT/metrics | grep ^deja_
MSG
exec "$DEJA" serve --model models/opt-mini --tp 2 --port "$PORT" \
  --metrics-port "$METRICS_PORT" --http-port "$HTTP_PORT" --predictors models/opt-mini/predictors.safetensors \
  --sparsity-default off "$@"
