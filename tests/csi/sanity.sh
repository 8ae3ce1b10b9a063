#!/usr/bin/env bash
# csi-sanity (kubernetes-csi/csi-test, pinned as a tool in csi/go.mod) against the Millrace CSI
# driver and two real `millrace serve` processes, each with one RAID5 pool of sparse drive files
# in a throwaway folder, API and NVMe/TCP on port 0: the Identity and Controller suites. The
# Node suite needs the kernel's NVMe/TCP initiator: tests/guest/csi-node.sh runs it in the guest.
#   usage: bash tests/csi/sanity.sh [extra csi-sanity flags]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
# shellcheck source=../lib/serve.sh
source "$root/tests/lib/serve.sh"
build_millrace
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
unset MILLRACE_SERVER MILLRACE_TOKEN

(cd csi && go build -o "$tmp/millrace-csi" ./cmd/millrace-csi && go build -o "$tmp/csi-sanity" github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity)

# start_millrace N: a home, a pool tankN of three 4 GiB sparse drives, `millrace serve`; sets
# urls[N].
urls=()
start_millrace() {
  local n=$1 home=$tmp/s$1/home
  mkdir -p "$tmp/s$n"
  MILLRACE_HOME=$home "$bin" pool create "tank$n" --level raid5 --strip 64k --create 4G \
    "$tmp/s$n"/d{0..2}.img >/dev/null
  MILLRACE_HOME=$home "$bin" serve --api 127.0.0.1:0 --nvme 127.0.0.1:0 --discovery-port 0 \
    >"$tmp/s$n/serve.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 200); do
    [[ -s $home/server.json ]] && break
    kill -0 "${pids[-1]}" 2>/dev/null || { cat "$tmp/s$n/serve.log" >&2; exit 1; }
    sleep 0.1
  done
  [[ -s $home/server.json ]] || { echo "millrace serve $n did not start" >&2; exit 1; }
  urls[n]=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["url"])' "$home/server.json")
}
start_millrace 1
start_millrace 2

sock=$tmp/csi.sock
node=nqn.2014-08.org.nvmexpress:uuid:6d696c6c-7261-6365-6373-690000000001
"$tmp/millrace-csi" --endpoint "unix://$sock" --mode all --node-id "$node" \
  --server "${urls[1]}" --server "${urls[2]},zone=default,name=second" >"$tmp/csi.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do [[ -S $sock ]] && break; sleep 0.1; done
[[ -S $sock ]] || { cat "$tmp/csi.log" >&2; exit 1; }

# Sizes are whole stripes (RAID5 of 3 drives with 64 KiB strips: 128 KiB), as the driver
# rounds up and the expansion test expects the size it asked for exactly.
sanity() {
  "$tmp/csi-sanity" --csi.endpoint "unix://$sock" \
    --csi.testvolumesize $((64 << 20)) --csi.testvolumeexpandsize $((96 << 20)) \
    --ginkgo.skip 'Node Service' --ginkgo.no-color --ginkgo.timeout 10m "$@"
}
# left N: how many volumes server N still holds.
left() {
  MILLRACE_HOME=$tmp/s$1/home "$bin" volume list --json |
    python3 -c 'import json,sys; v=json.load(sys.stdin); print(len(v if isinstance(v, list) else v.get("volumes", [])))'
}
rc=0
sanity "$@" || rc=$?
# A publish carrying a Kubernetes secret gives the server the node's DH-HMAC-CHAP secrets,
# and no secret reaches an error or the driver's log.
if ((rc == 0)); then
  echo "=== DH-HMAC-CHAP secrets from ControllerPublish, against server 1"
  (cd csi && MILLRACE_TEST_SERVER=${urls[1]} go test ./internal/driver/ -run '^TestPublishSecrets' -count=1 -v) || rc=$?
fi
[[ $(left 1) == 0 ]] || { echo "server 1 still holds volumes after csi-sanity" >&2; rc=1; }
# A server that is down stops only its own volumes: with the first one killed, the suite runs
# again and every volume goes to the second.
if ((rc == 0)); then
  kill "${pids[0]}"; wait "${pids[0]}" 2>/dev/null || true
  echo "=== again with server 1 (${urls[1]}) down"
  sanity "$@" || rc=$?
fi
if ((rc)); then
  echo "--- driver log (tail)"; tail -40 "$tmp/csi.log"
fi
[[ $(left 2) == 0 ]] || { echo "server 2 still holds volumes after csi-sanity" >&2; rc=1; }
grep -q "does not answer" "$tmp/csi.log" || { echo "the driver never noticed the server that was down" >&2; rc=1; }
exit $rc
