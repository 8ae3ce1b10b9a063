#!/usr/bin/env bash
# NBD: Millrace against nbdkit's file plugin (issue #15), fio's nbd engine as the client for both,
# each server pinned to CPU 0 and fio to CPU 1, over Unix sockets. Millrace serves a RAID0 volume
# over 4 drive files in /dev/shm (64 KiB strips); nbdkit serves one file in /dev/shm of the
# volume's size. Both are written in full first, so every read touches data. Rows: 4K random read
# and write at QD32 on 1 and 4 connections, 1M sequential read and write at QD8. Each row: IOPS,
# the ratio, and each server's CPU microseconds per request (user + system of the process).
# Timing: run it on a quiet machine (nothing else compiling).
# Usage: scripts/bench-nbd-nbdkit.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
member_mib=${MEMBER_MIB:-512}
for tool in nbdkit fio taskset; do
    command -v "$tool" >/dev/null || { echo "$tool is not installed: run scripts/setup.sh" >&2; exit 1; }
done
fio --enghelp 2>/dev/null | grep -qw nbd || { echo "this fio has no nbd engine (Debian's has): the benchmark is skipped" >&2; exit 0; }
source scripts/bench-lib.sh
[[ -n ${MILLRACE_BIN:-} ]] || cargo build --release -q -p millrace-cli -p millrace-server
tmp=$(mktemp -d)
peer=
cleanup() {
    stop_millrace
    [[ -n $peer ]] && kill "$peer" 2>/dev/null && wait "$peer" 2>/dev/null
    rm -rf "$tmp" "/dev/shm/nbdkit-bench-$$.img"
}
trap cleanup EXIT

# run_fio URI RW BS QD JOBS SECONDS [SIZE]: prints "IOPS IOS"
run_fio() {
    local extra=(--time_based --runtime="$6")
    [[ -n ${7:-} ]] && extra=(--size="$7")
    taskset -c 1 fio --name=b --ioengine=nbd --uri="$1" --rw="$2" --bs="$3" --iodepth="$4" \
        --numjobs="$5" --group_reporting "${extra[@]}" --output-format=json 2>/dev/null |
        python3 -c '
import json, sys
s = sys.stdin.read()  # fio prints "connected to NBD server" before its JSON
j = json.loads(s[s.index("{"):])["jobs"][0]
d = j["read"] if j["read"]["io_bytes"] else j["write"]
print("%.0f %d" % (d["iops"], d["total_ios"]))'
}

rows=("randread 4k 32 1" "randwrite 4k 32 1" "randread 4k 32 4" "randwrite 4k 32 4" "read 1m 8 1" "write 1m 8 1")
declare -A iops cpu

# measure URI PID SIDE
measure() {
    run_fio "$1" write 1m 8 1 0 "$vol_size" >/dev/null # fill
    for row in "${rows[@]}"; do
        read -r rw bs qd jobs <<<"$row"
        run_fio "$1" "$rw" "$bs" "$qd" "$jobs" 2 >/dev/null # warm
        local t0 t1 c0 c1 r n
        t0=$(cpu_ticks "$2"); c0=$(cpu_stat 0)
        read -r r n < <(run_fio "$1" "$rw" "$bs" "$qd" "$jobs" "$secs")
        c1=$(cpu_stat 0); t1=$(cpu_ticks "$2")
        iops[$3 $row]=$r
        cpu[$3 $row]=$(us_per_io "$t0" "$t1" "$n")
        # Did the server have CPU 0 to itself? Its share of the core, and what else ran there.
        local b0 a0 b1 a1 others
        read -r b0 a0 <<<"$c0"; read -r b1 a1 <<<"$c1"
        others=$(awk -v b=$((b1 - b0)) -v a=$((a1 - a0)) -v t=$((t1 - t0)) 'BEGIN { printf "%.0f", 100 * (b - t) / a }')
        echo "  $3 $row: $r IOPS, ${cpu[$3 $row]} us CPU per request; others on CPU 0: ${others}%" >&2
        ((others < 5)) || echo "  WARNING: CPU 0 was shared with other work; do not trust this row" >&2
    done
}

echo "Millrace (RAID0, 4 x ${member_mib} MiB in /dev/shm), server on CPU 0, fio on CPU 1" >&2
start_millrace "$tmp/home" 0 raid0 4 "${member_mib}M" --no-nvme --api 127.0.0.1:8748
"$m" export nbd add bench/v --name v >/dev/null
echo "  server pinned to CPUs $(pinned_to "$server"); volume $vol_size bytes" >&2
measure "nbd+unix:///v?socket=$MILLRACE_HOME/nbd.sock" "$server" mr
size=$vol_size
stop_millrace

echo "nbdkit file plugin over /dev/shm, pinned to CPU 0" >&2
truncate -s "$size" "/dev/shm/nbdkit-bench-$$.img"
taskset -c 0 nbdkit -f -U "$tmp/peer.sock" file "/dev/shm/nbdkit-bench-$$.img" &
peer=$!
for _ in $(seq 100); do [[ -S $tmp/peer.sock ]] && break; sleep 0.1; done
vol_size=$size
measure "nbd+unix:///?socket=$tmp/peer.sock" "$peer" nk

echo
echo "| workload | QD | connections | Millrace | nbdkit | ratio | server CPU us/request Millrace | nbdkit |"
echo "|---|---|---|---|---|---|---|---|"
for row in "${rows[@]}"; do
    read -r rw bs qd jobs <<<"$row"
    echo "| $rw $bs | $qd | $jobs | ${iops[mr $row]} | ${iops[nk $row]} | $(ratio "${iops[mr $row]}" "${iops[nk $row]}") | ${cpu[mr $row]} | ${cpu[nk $row]} |"
done
