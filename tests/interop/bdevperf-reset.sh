#!/usr/bin/env bash
# SPDK's bdevperf against a Millrace NVMe/TCP export with its reset workload: bdevperf keeps 32
# I/Os in flight and resets the controller under them (SPDK's initiator drops its queues,
# reconnects and goes on, as the Linux host does after a network blip), over and over for the
# run; then verified I/O on the same controller. It passes when bdevperf finishes with no failed
# I/O and `millrace serve` is still up, serving. (Before #46 the first reset ended the server
# with SIGPIPE, status 141.)
#
# SPDK is not packaged and the test suite does not build it (20+ minutes on 2 cores): point
# SPDK_DIR at a built SPDK v24.01 tree (build/examples/bdevperf); without it this script says so
# and fails. Runs as root, without hugepages (--no-huge).
#   SPDK_DIR=/path/to/spdk bash tests/interop/bdevperf-reset.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-20}
spdk=${SPDK_DIR:-}
bdevperf=$spdk/build/examples/bdevperf
if [[ -z $spdk || ! -x $bdevperf ]]; then
  echo "bdevperf-reset: SPDK_DIR must name a built SPDK v24.01 tree (build/examples/bdevperf); nothing was tested" >&2
  exit 1
fi
source tests/lib/serve.sh
build_millrace
throwaway_home
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
host=nqn.2014-08.org.nvmexpress:uuid:6d696c6c-7261-6365-0000-726573657431
nqn=nqn.2026-11.dev.millrace:tank.v
drives=()
for i in 0 1 2 3 4 5; do drives+=("$tmp/d$i.img"); done
"$bin" pool create tank --level raid6 --create 128M "${drives[@]}" > /dev/null
start_server "$tmp" --api 127.0.0.1:0 --nvme "127.0.0.1:$port" --discovery-port 0
"$bin" volume create tank/v --size 256M > /dev/null
"$bin" export nvme add tank/v --host "$host" > /dev/null
cat > "$tmp/bdev.json" <<EOF
{"subsystems": [{"subsystem": "bdev", "config": [
  {"method": "bdev_nvme_attach_controller", "params": {"name": "Millrace", "trtype": "TCP",
   "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": "$port", "subnqn": "$nqn",
   "hostnqn": "$host"}}]}]}
EOF
run() { # WORKLOAD SECONDS LOG
  "$bdevperf" --no-huge -s 1024 --json "$tmp/bdev.json" -q 32 -o 4096 -w "$1" -t "$2" > "$3" 2>&1
}
ok=1
run reset "$secs" "$tmp/reset.log" || { echo "bdevperf -w reset failed:"; tail -30 "$tmp/reset.log"; ok=0; }
kill -0 "$server" 2>/dev/null || { echo "millrace serve ended during the resets:"; tail -20 "$tmp/serve.log"; exit 1; }
run verify 10 "$tmp/verify.log" || { echo "bdevperf -w verify after the resets failed:"; tail -30 "$tmp/verify.log"; ok=0; }
kill -0 "$server" 2>/dev/null || { echo "millrace serve ended:"; tail -20 "$tmp/serve.log"; exit 1; }
grep -E 'Total|Millrace' "$tmp/reset.log" "$tmp/verify.log" | sed 's/^/  /'
# Total's columns: IOPS, MiB/s, Fail/s, TO/s, then latencies.
vfail=$(tr "\r" "\n" < "$tmp/verify.log" | awk '$1 == "Total" && $2 == ":" { print $5 }')
[[ $vfail == 0.00 ]] || { echo "bdevperf's verify after the resets failed I/Os ($vfail/s)"; ok=0; }
resets=$(grep -ciE "resetting controller" "$tmp/reset.log" || true)
echo "bdevperf-reset: reset workload for $secs s ($resets controller resets logged; the I/Os a reset aborts count as failed in its row, as in SPDK's own runs), then 10 s verify; server up (pid $server)"
((ok)) && echo "bdevperf-reset: PASS" || { echo "bdevperf-reset: FAILED"; exit 1; }
