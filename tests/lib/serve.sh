# Sourced by the test scripts that drive a real `millrace serve` (tests/api, tests/dashboard):
# find (or build) the CLI, make a throwaway home that is removed on exit, start the server and
# wait for it. Sets: bin (the CLI), tmp (the throwaway folder), MILLRACE_HOME, server (its pid),
# url.

# shellcheck source=bins.sh
source "$(dirname "${BASH_SOURCE[0]}")/bins.sh"

build_millrace() {
  millrace_bins || { echo "could not build the binaries" >&2; exit 1; }
  bin=$bins/millrace
  [[ -x $bin ]] || { echo "$bin is missing" >&2; exit 1; }
}

throwaway_home() {
  tmp=$(mktemp -d)
  server=""
  trap stop_throwaway EXIT
  export MILLRACE_HOME=$tmp/home
  unset MILLRACE_SERVER MILLRACE_TOKEN
}

stop_throwaway() {
  if [[ -n $server ]]; then
    kill "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
  fi
  rm -rf "$tmp"
}

# start_server DIR SERVE-ARGS...: run `millrace serve` in DIR, its log in $tmp/serve.log, and
# wait until it has written server.json (or fail with its log).
start_server() {
  local dir=$1
  shift
  (cd "$dir" && exec "$bin" serve "$@") >"$tmp/serve.log" 2>&1 &
  server=$!
  # A start after a crash resyncs the pools first: in a debug build on a busy machine that can
  # take tens of seconds.
  for _ in $(seq 1 600); do
    [[ -s $MILLRACE_HOME/server.json ]] && break
    kill -0 "$server" 2>/dev/null || { cat "$tmp/serve.log" >&2; exit 1; }
    sleep 0.1
  done
  [[ -s $MILLRACE_HOME/server.json ]] || { echo "millrace serve did not start in 60 s" >&2; cat "$tmp/serve.log" >&2; exit 1; }
  url=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["url"])' "$MILLRACE_HOME/server.json")
}
