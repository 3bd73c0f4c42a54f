# Sourced by bench scripts that start `beluga serve` themselves.
# start_server LOG CMD...: runs CMD in the background (output in LOG), waits for its "serving
#   http://127.0.0.1:PORT" line and sets `pid` and `port`; prints LOG and exits if it never comes.
# stop_server: ends it.
start_server() {
  local log=$1
  shift
  "$@" >"$log" 2>&1 &
  pid=$!
  port=
  for _ in $(seq 1800); do
    port=$(grep "serving " "$log" | sed -n 's/.*http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' | head -1 || true)
    [ -n "$port" ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  [ -n "$port" ] || { cat "$log"; exit 1; }
}
stop_server() {
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  pid=
}
