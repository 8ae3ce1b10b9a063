#!/usr/bin/env bash
# Soak: many clients over loopback against a `millrace serve` (NVMe/TCP controllers that write
# and read back, controllers dropped mid-write, NBD connections that write and read back, NBD
# writes abandoned mid-payload, half-sent ICReqs and HTTP requests, whole HTTP requests), then
# every acknowledged write must read back, and the server's resident memory and open descriptors
# must be back near where they were after a warm-up round.
#   bash tests/soak/run.sh [SECONDS [CLIENTS]]     (45 s and 16 clients by default; the hour
#   is `bash tests/soak/run.sh 3600 16`). The server's VmRSS and descriptors are sampled every
#   SOAK_SAMPLE seconds (30 by default) during the soak and printed at the end.
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-45}
clients=${2:-16}
# The binaries scripts/test.sh built with the tests (MILLRACE_BINS), or the same build.
source tests/lib/bins.sh
millrace_bins
bin=$bins/millrace
soak=$bins/examples/soak
dir=$(mktemp -d)
export MILLRACE_HOME=$dir/home
pid=
sampler=
cleanup() {
  [[ -n $sampler ]] && kill "$sampler" 2>/dev/null
  [[ -n $pid ]] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
"$bin" serve --api 127.0.0.1:0 --nvme 127.0.0.1:0 --discovery-port 0 --api-header-timeout 2 \
  2> "$dir/serve.log" &
pid=$!
for _ in $(seq 600); do [[ -f $MILLRACE_HOME/server.json ]] && break; sleep 0.1; done
url=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["url"])' "$MILLRACE_HOME/server.json")
api=${url#http://}
call() { curl -sS --fail-with-body -X "$1" -H 'Content-Type: application/json' "$url$2" ${3:+-d "$3"}; }
vol=$((256 << 20))
call POST /api/v1/pools "{\"name\":\"soak\",\"level\":\"raid5\",\"strip_bytes\":65536,\"drives\":[\"$dir/d0\",\"$dir/d1\",\"$dir/d2\"],\"create_size_bytes\":$((192 << 20))}" > /dev/null
call POST /api/v1/pools/soak/volumes "{\"name\":\"v\",\"size_bytes\":$vol}" > /dev/null
nqn=nqn.2026-11.dev.millrace:soak
call POST /api/v1/exports/nvme "{\"pool\":\"soak\",\"volume\":\"v\",\"nqn\":\"$nqn\",\"allow_any_host\":true}" > /dev/null
# A second volume for the NBD clients, on the server's own Unix socket.
nbd_vol=$((64 << 20))
call POST /api/v1/pools/soak/volumes "{\"name\":\"n\",\"size_bytes\":$nbd_vol}" > /dev/null
call POST /api/v1/exports/nbd '{"pool":"soak","volume":"n"}' > /dev/null
nbd=("$MILLRACE_HOME/nbd.sock" soak/n "$nbd_vol")
port=$(call GET /api/v1/status | python3 -c 'import json,sys; print(json.load(sys.stdin)["nvme_listeners"][0]["port"])')
nvme=127.0.0.1:$port
# Half-sent connections end after the API's header timeout (2 s here) and the ICReq timeout
# (10 s): measure once they have.
settle() { sleep 13; }
measure() {
  echo "$(awk '/^VmRSS/ {print $2}' /proc/$pid/status) $(ls /proc/$pid/fd | wc -l)"
}
echo "--- warm-up: 10 s"
"$soak" "$nvme" "$nqn" "$api" 10 "$clients" "$vol" 1 "${nbd[@]}"
settle
read -r rss0 fd0 < <(measure)
echo "--- soak: $secs s, $clients clients (after the warm-up: VmRSS $rss0 KiB, $fd0 descriptors)"
t0=$SECONDS
( while sleep "${SOAK_SAMPLE:-30}"; do echo "  at $((SECONDS - t0)) s: VmRSS/KiB descriptors $(measure)"; done ) > "$dir/samples" &
sampler=$!
"$soak" "$nvme" "$nqn" "$api" "$secs" "$clients" "$vol" 2 "${nbd[@]}"
kill "$sampler"
sampler=
cat "$dir/samples"
settle
read -r rss1 fd1 < <(measure)
echo "after the soak: VmRSS $rss1 KiB, $fd1 descriptors"
status=0
if ((fd1 > fd0 + 4)); then echo "FAIL: descriptors grew from $fd0 to $fd1"; status=1; fi
# Some growth is the allocator keeping freed memory; a leak per connection is far more.
if ((rss1 > rss0 + rss0 / 4 + 65536)); then echo "FAIL: VmRSS grew from $rss0 to $rss1 KiB"; status=1; fi
kill "$pid"; wait "$pid" || { echo "FAIL: the server did not stop cleanly"; status=1; }
pid=
if ((status)); then tail -n 30 "$dir/serve.log"; fi
exit $status
