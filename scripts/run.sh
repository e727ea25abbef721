#!/usr/bin/env bash
# The main job: install dependencies, build, and serve the bundled models/opt-mini with two
# tensor-parallel CPU workers (gRPC on 127.0.0.1:50051, Prometheus /metrics on :9090; pass
# --host 0.0.0.0, with TLS and tokens, to serve other hosts: docs/serving.md#security). Its
# Deja Vu predictors are loaded with sparsity off by default: on a model this small the dense
# step is faster (docs/performance.md); requests opt in with Sparsity.mode = MODE_ON.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/build.sh
PORT=${DEJA_PORT:-50051}
METRICS_PORT=${DEJA_METRICS_PORT:-9090}
# The banner names the ports the server will use: --port / --metrics-port given here win.
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[i]}" in
    --port=*) PORT=${args[i]#--port=} ;;
    --metrics-port=*) METRICS_PORT=${args[i]#--metrics-port=} ;;
    --port) PORT=${args[i + 1]:-$PORT} ;;
    --metrics-port) METRICS_PORT=${args[i + 1]:-$METRICS_PORT} ;;
  esac
done
cat <<MSG
Starting deja serve on models/opt-mini (tp=2). When it logs that it is ready, in another shell:
  ./build/release/cli/deja client stream --target 127.0.0.1:$PORT --prompt "And God said" --max-new-tokens 32
  ./build/release/cli/deja client stream --target 127.0.0.1:$PORT --prompt "And God said" --max-new-tokens 32 --sparsity on
  ./build/release/cli/deja client health --target 127.0.0.1:$PORT --service deja.v1.TextGeneration
  curl -s 127.0.0.1:$METRICS_PORT/metrics | grep ^deja_
MSG
exec ./build/release/cli/deja serve --model models/opt-mini --tp 2 --port "$PORT" \
  --metrics-port "$METRICS_PORT" --predictors models/opt-mini/predictors.safetensors \
  --sparsity-default off "$@"
