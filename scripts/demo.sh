#!/usr/bin/env bash
# The main job on the embedded default: a RAID6 pool of eight drive files under ./millrace-data,
# data written at an unaligned offset and verified, then the pool served on 127.0.0.1: a volume
# exported over NBD and NVMe/TCP, data written and read back through a stock NBD client
# (libnbd's nbdcopy), the API and the dashboard. It keeps serving until Ctrl-C when run from a
# terminal; with --no-wait (or no terminal) it stops the server and exits.
set -euo pipefail
cd "$(dirname "$0")/.."
wait_at_end=1
[[ ${1:-} == --no-wait || ! -t 0 ]] && wait_at_end=0
bash scripts/setup.sh
cargo build --release -q -p millrace-cli -p millrace-server
export MILLRACE_HOME=${MILLRACE_HOME:-$PWD/millrace-data}
m=$PWD/target/release/millrace
drives=$MILLRACE_HOME/drives
api=127.0.0.1:${MILLRACE_DEMO_API_PORT:-8740}

if [[ -f $MILLRACE_HOME/server.json ]] && $m pool list >/dev/null 2>&1; then
  pid=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["pid"])' "$MILLRACE_HOME/server.json" 2>/dev/null || true)
  if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
    echo "stopping the millrace server left running by an earlier demo (pid $pid)"
    kill "$pid"; while kill -0 "$pid" 2>/dev/null; do sleep 0.2; done
  fi
fi
if $m pool show demo >/dev/null 2>&1; then
  for e in nvme nbd; do $m export $e remove demo/data >/dev/null 2>&1 || true; done
  $m pool destroy demo --yes
fi
rm -f "$drives"/d{0..7}.img
$m pool create demo --level raid6 --strip 64k --create 2G "$drives"/d{0..7}.img >/dev/null

data=$(mktemp); back=$(mktemp)
server=
cleanup() {
  rm -f "$data" "$back"
  if [[ -n $server ]] && kill -0 "$server" 2>/dev/null; then kill "$server"; wait "$server" || true; fi
}
trap cleanup EXIT
head -c $((256 << 20)) /dev/urandom > "$data"
echo "writing 256 MiB at offset 12345..."
$m io write demo --offset 12345 --input "$data"
$m io read demo --offset 12345 --length $((256 << 20)) --output "$back"
if cmp -s "$data" "$back"; then
  echo "verified: the 256 MiB read back equal what was written"
else
  echo "FAILED: the data read back differs" >&2; exit 1
fi
$m pool show demo

echo
echo "serving the pool on 127.0.0.1..."
# The raw bytes written above are only the check's; the volume table may take their place.
$m volume create demo/data --size 256M --force >/dev/null
$m export nbd add demo/data >/dev/null
$m export nvme add demo/data --host "$(cat /etc/nvme/hostnqn 2>/dev/null || echo nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000000)" >/dev/null
$m serve --api "$api" --nvme 127.0.0.1:4420 --discovery-port 8009 &
server=$!
for _ in $(seq 100); do [[ -f $MILLRACE_HOME/server.json ]] && $m status >/dev/null 2>&1 && break; sleep 0.1; done
uri="nbd+unix:///demo/data?socket=$MILLRACE_HOME/nbd.sock"
head -c $((64 << 20)) /dev/urandom > "$data"
nbdcopy --flush "$data" "$uri"
nbdcopy "$uri" "$back"
if cmp -s -n $((64 << 20)) "$data" "$back"; then
  echo "verified: 64 MiB written and read back through the NBD export (nbdcopy) of volume demo/data"
else
  echo "FAILED: the data read back through NBD differs" >&2; exit 1
fi
$m volume list
$m export list
echo
echo "dashboard: http://$api/    API: http://$api/api/v1/openapi.json    metrics: http://$api/metrics"
echo "NVMe/TCP: nvme discover -t tcp -a 127.0.0.1 -s 8009 (host NQN from /etc/nvme/hostnqn)"
if ((wait_at_end)); then
  echo "serving until Ctrl-C"
  wait "$server" || true
  server=
else
  echo "stopping the server (run with a terminal to keep it serving)"
fi
