# Shared by the serving benchmarks (source it): start `deja serve` in the background and wait
# until its TextGeneration service reports SERVING; stop it with SIGTERM (a graceful drain).
#   start_deja_serve DEJA PORT LOG [deja serve flags...]   sets SERVE (its pid)
#   stop_deja_serve
start_deja_serve() {
  local deja=$1 port=$2 log=$3
  shift 3
  "$deja" serve --port "$port" "$@" 2>"$log" &
  SERVE=$!
  trap 'kill $SERVE 2>/dev/null || true' EXIT
  for _ in $(seq 600); do
    "$deja" client health --target "127.0.0.1:$port" --service deja.v1.TextGeneration \
      >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  echo "deja serve did not become ready; see $log" >&2
  return 1
}

stop_deja_serve() {
  kill -TERM "$SERVE"
  wait "$SERVE" || true
  trap - EXIT
}
