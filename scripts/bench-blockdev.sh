#!/usr/bin/env bash
# Block devices first (issue #48): what a request costs Millrace when its members are block
# devices opened O_DIRECT, as NVMe drives are, beside the same on drive files in memory and beside
# the devices' own limit, in one run on the same devices. The block devices are loop devices with
# direct I/O over files in /dev/shm (this machine has no spare drives), 4 of MEMBER_MIB each.
#
# NVMe/TCP (SPDK's spdk_nvme_perf as the initiator, on CPU 1; the target on CPU 0):
#   - Millrace, RAID0 (64 KiB strips) over the 4 loop devices;
#   - Millrace, RAID0 over 4 drive files in /dev/shm (the memory members of earlier rounds);
#   - fio with io_uring straight on the same 4 loop devices, one job on CPU 1, the same queue
#     depth: the devices' own limit in this setup (no network, no target);
#   - SPDK's nvmf_tgt over AIO bdevs on the same loop devices (PEERS=spdk-aio, off by default: on
#     2 cores its polling reactor leaves the loop devices' kernel workers no CPU and it falls to
#     about 10k IOPS, which is not a fair comparison; run it where a machine has cores to spare).
#   Rows: 4K random read and write at QD64, 128K sequential read and write at QD16. Each row: IOPS,
#   the target's CPU microseconds per I/O (user + system of the process, all threads), its context
#   switches per I/O, and io_uring's punts per I/O: entries the kernel could not issue without
#   blocking and handed to a worker thread (the tracepoint io_uring:io_uring_queue_async_work,
#   counted by `perf stat` where perf and tracefs are there; else the most iou-wrk threads seen).
# NBD (fio's nbd engine on CPU 1, the server on CPU 0, over a Unix socket), on ONE loop device:
#   - Millrace, a one-member RAID0 over it; qemu-nbd --cache=none --aio=io_uring over it.
#   Rows: 4K random read and write at QD32, 1M sequential read and write at QD8.
#
# Needs root and /dev/loop-control (loop devices), fio, qemu-nbd; SPDK_DIR (a built SPDK v24.01
# tree) for the NVMe/TCP part (without it that part is skipped and says so). Run it on a quiet
# machine. Usage: [SPDK_DIR=...] [MEMBER_MIB=512] scripts/bench-blockdev.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
member_mib=${MEMBER_MIB:-512}
peers=${PEERS:-}
spdk=${SPDK_DIR:-}
if [[ $EUID != 0 || ! -e /dev/loop-control ]]; then
    echo "this benchmark makes loop devices: run it as root on a machine with /dev/loop-control" >&2
    exit 1
fi
for tool in fio losetup taskset; do
    command -v "$tool" >/dev/null || { echo "$tool is not installed: run scripts/setup.sh" >&2; exit 1; }
done
source scripts/bench-lib.sh
[[ -n ${MILLRACE_BIN:-} ]] || cargo build --release -q -p millrace-cli -p millrace-server
host=nqn.2014-08.org.nvmexpress:uuid:6d696c6c-7261-6365-0000-62656e636831
nqn=nqn.2026-11.dev.millrace:bench.v
tmp=$(mktemp -d)
loops=() peer=
cleanup() {
    stop_millrace
    [[ -n $peer ]] && kill "$peer" 2>/dev/null && wait "$peer" 2>/dev/null
    for d in "${loops[@]}"; do losetup -d "$d" 2>/dev/null || true; done
    rm -f /dev/shm/millrace-blk-$$-*.img
    rm -rf "$tmp"
}
trap cleanup EXIT

# fresh_loops N MIB: N loop devices with direct I/O over new files in /dev/shm (sets loops)
fresh_loops() {
    for d in "${loops[@]}"; do losetup -d "$d" 2>/dev/null || true; done
    loops=()
    rm -f /dev/shm/millrace-blk-$$-*.img
    local i f
    for ((i = 0; i < $1; i++)); do
        f=/dev/shm/millrace-blk-$$-$i.img
        truncate -s "$2M" "$f"
        loops+=("$(losetup --find --show --direct-io=on "$f")")
    done
    for d in "${loops[@]}"; do
        [[ $(cat "/sys/block/${d#/dev/}/loop/dio") == 1 ]] || { echo "$d did not take direct I/O" >&2; exit 1; }
    done
}

# sample_workers PID FILE: records the most iou-wrk threads PID had, every 0.1 s, until killed
sample_workers() {
    local most=0 n
    while kill -0 "$1" 2>/dev/null; do
        n=$(iowq_workers "$1"); ((n > most)) && most=$n
        echo "$most" >"$2"
        sleep 0.1
    done
}

mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
punts_traced=0
command -v perf >/dev/null && [[ -d /sys/kernel/tracing/events/io_uring/io_uring_queue_async_work ]] && punts_traced=1

# timed PID SIDE ROW COMMAND...: runs COMMAND (which prints "IOPS IOS"), and records for SIDE ROW
# the IOPS, PID's CPU us per I/O, context switches per I/O and io_uring punts per I/O
declare -A iops cpu ctx wq
timed() {
    local pid=$1 key="$2 $3"
    shift 3
    local t0 t1 s0 s1 r n watcher
    echo 0 >"$tmp/wq"
    if ((punts_traced)); then
        perf stat -x, -e io_uring:io_uring_queue_async_work -p "$pid" -o "$tmp/punts" &
    else
        sample_workers "$pid" "$tmp/wq" &
    fi
    watcher=$!
    local c0 c1 b0 a0 b1 a1 others
    t0=$(cpu_ticks "$pid"); s0=$(ctx_switches "$pid"); c0=$(cpu_stat 0)
    read -r r n < <("$@")
    t1=$(cpu_ticks "$pid"); s1=$(ctx_switches "$pid"); c1=$(cpu_stat 0)
    read -r b0 a0 <<<"$c0"; read -r b1 a1 <<<"$c1"
    # What else ran on CPU 0 (the server's core) meanwhile: the loop devices' kernel workers and
    # anything else on the machine.
    others=$(awk -v b=$((b1 - b0)) -v a=$((a1 - a0)) -v t=$((t1 - t0)) 'BEGIN { o = 100 * (b - t) / a; if (o < 0) o = 0; printf "%.0f", o }')
    kill -INT "$watcher" 2>/dev/null; wait "$watcher" 2>/dev/null || true
    iops[$key]=$r
    cpu[$key]=$(us_per_io "$t0" "$t1" "$n")
    ctx[$key]=$(awk -v a="$s0" -v b="$s1" -v n="$n" 'BEGIN { if (n > 0) printf "%.2f", (b - a) / n; else print "-" }')
    if ((punts_traced)); then
        wq[$key]=$(awk -F, -v n="$n" '/io_uring_queue_async_work/ { if (n > 0) printf "%.3f", $1 / n }' "$tmp/punts")
    else
        wq[$key]="workers $(cat "$tmp/wq")"
    fi
    echo "  $key: $r IOPS, ${cpu[$key]} us CPU/I/O, ${ctx[$key]} context switches/I/O, io-wq punts/I/O ${wq[$key]}; others on CPU 0: ${others}%" >&2
}

nvme_rows=("randread 4096 64" "randwrite 4096 64" "read 131072 16" "write 131072 16")

# nvme_perf PORT NQN WORKLOAD SIZE QD SECONDS: prints "IOPS IOS"
nvme_perf() {
    local out
    out=$(taskset -c 1 "$spdk/build/bin/spdk_nvme_perf" --no-huge -s 1024 -c 0x2 -q "$5" -o "$4" -w "$3" -t "$6" \
        -r "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:$1 subnqn:$2 hostnqn:$host" 2>&1) || {
        echo "$out" >&2
        return 1
    }
    echo "$out" | awk -v t="$6" '/^Total/ { for (i = 1; i <= NF; i++) if ($i == ":") { printf "%s %d\n", $(i + 1), $(i + 1) * t; exit } }'
}

# nvme_side SIDE PORT NQN PID: fills the volume, then runs every row against it
nvme_side() {
    local pass=$((member_mib * 4 / 400 + 3)) row w bs qd
    nvme_perf "$2" "$3" write 1048576 8 "$pass" >/dev/null
    for row in "${nvme_rows[@]}"; do
        read -r w bs qd <<<"$row"
        nvme_perf "$2" "$3" "$w" "$bs" "$qd" 2 >/dev/null
        timed "$4" "$1" "$row" nvme_perf "$2" "$3" "$w" "$bs" "$qd" "$secs"
    done
}

# fio_direct ROW: fio with io_uring on the loop devices themselves, one job on CPU 1
fio_direct() {
    local w=$1 bs=$2 qd=$3 files
    files=$(IFS=:; echo "${loops[*]}")
    taskset -c 1 fio --name=raw --ioengine=io_uring --direct=1 --filename="$files" --rw="$w" --bs="$bs" \
        --iodepth="$qd" --time_based --runtime="$secs" --output-format=json 2>/dev/null |
        python3 -c '
import json, sys
j = json.load(sys.stdin)["jobs"][0]
d = j["read"] if j["read"]["io_bytes"] else j["write"]
print("%.0f %d" % (d["iops"], d["total_ios"]))'
}

if [[ -z $spdk || ! -x $spdk/build/bin/spdk_nvme_perf ]]; then
    echo "SPDK_DIR is not set to a built SPDK v24.01 tree: the NVMe/TCP part (spdk_nvme_perf is its initiator) is skipped" >&2
    nvme=0
else
    nvme=1
fi

if ((nvme)); then
    fresh_loops 4 "$member_mib"
    echo "Millrace NVMe/TCP, RAID0 over 4 loop devices (direct I/O), target on CPU 0" >&2
    MEMBER_DEVICES="${loops[*]}" start_millrace "$tmp/home-blk" 0 raid0 4 - --nvme 127.0.0.1:4420 --discovery-port 8019 --api 127.0.0.1:8749
    "$m" export nvme add bench/v --host "$host" >/dev/null
    nvme_side blk 4420 "$nqn" "$server"
    stop_millrace

    echo "Millrace NVMe/TCP, RAID0 over 4 drive files in /dev/shm, target on CPU 0" >&2
    start_millrace "$tmp/home-mem" 0 raid0 4 "${member_mib}M" --nvme 127.0.0.1:4420 --discovery-port 8019 --api 127.0.0.1:8749
    "$m" export nvme add bench/v --host "$host" >/dev/null
    nvme_side mem 4420 "$nqn" "$server"
    stop_millrace

    echo "fio io_uring on the same 4 loop devices, one job on CPU 1" >&2
    fresh_loops 4 "$member_mib"
    for row in "${nvme_rows[@]}"; do
        read -r w bs qd <<<"$row"
        timed $$ fio "$row" fio_direct "$w" "$bs" "$qd"
    done

    if [[ " $peers " == *" spdk-aio "* ]]; then
        fresh_loops 4 "$member_mib"
        echo "SPDK nvmf_tgt, RAID0 bdev over AIO bdevs on the same 4 loop devices, reactor on CPU 0" >&2
        sock=$tmp/spdk.sock
        "$spdk/build/bin/nvmf_tgt" -m 0x1 --no-huge -s 1024 -r "$sock" >"$tmp/tgt.log" 2>&1 &
        peer=$!
        rpc() { "$spdk/scripts/rpc.py" -s "$sock" "$@" >/dev/null; }
        for _ in $(seq 100); do [[ -S $sock ]] && break; sleep 0.2; done
        rpc nvmf_create_transport -t TCP
        for i in 0 1 2 3; do rpc bdev_aio_create "${loops[$i]}" "a$i" 512; done
        rpc bdev_raid_create -n r0 -z 64 -r 0 -b "a0 a1 a2 a3"
        rpc nvmf_create_subsystem nqn.2016-06.io.spdk:bench -s SPDK0001
        rpc nvmf_subsystem_add_host nqn.2016-06.io.spdk:bench "$host"
        rpc nvmf_subsystem_add_ns nqn.2016-06.io.spdk:bench r0
        rpc nvmf_subsystem_add_listener nqn.2016-06.io.spdk:bench -t tcp -f ipv4 -a 127.0.0.1 -s 4421
        nvme_side spdk 4421 nqn.2016-06.io.spdk:bench "$peer"
        kill "$peer"; wait "$peer" 2>/dev/null || true; peer=
    fi
fi

# NBD: Millrace and qemu-nbd on one loop device
nbd_rows=("randread 4k 32" "randwrite 4k 32" "read 1m 8" "write 1m 8")
# nbd_fio URI RW BS QD [SIZE]: prints "IOPS IOS" (with SIZE: one pass over it, not timed)
nbd_fio() {
    local extra=(--time_based --runtime="$secs")
    [[ -n ${5:-} ]] && extra=(--size="$5")
    taskset -c 1 fio --name=b --ioengine=nbd --uri="$1" --rw="$2" --bs="$3" --iodepth="$4" \
        "${extra[@]}" --output-format=json 2>/dev/null |
        python3 -c '
import json, sys
s = sys.stdin.read()
j = json.loads(s[s.index("{"):])["jobs"][0]
d = j["read"] if j["read"]["io_bytes"] else j["write"]
print("%.0f %d" % (d["iops"], d["total_ios"]))'
}
nbd_side() { # SIDE URI PID SIZE
    nbd_fio "$2" write 1m 8 "$4" >/dev/null
    local row rw bs qd
    for row in "${nbd_rows[@]}"; do
        read -r rw bs qd <<<"$row"
        timed "$3" "$1" "$row" nbd_fio "$2" "$rw" "$bs" "$qd"
    done
}
if fio --enghelp 2>/dev/null | grep -qw nbd && command -v qemu-nbd >/dev/null; then
    fresh_loops 1 $((member_mib * 2))
    echo "Millrace NBD, one-member RAID0 on a loop device (direct I/O), server on CPU 0" >&2
    MEMBER_DEVICES="${loops[0]}" VOL_SIZE=$((member_mib * 2 - 64))M start_millrace "$tmp/home-nbd" 0 raid0 1 - --no-nvme --api 127.0.0.1:8748
    "$m" export nbd add bench/v --name v >/dev/null
    nbd_side nbd-mr "nbd+unix:///v?socket=$MILLRACE_HOME/nbd.sock" "$server" "$(((member_mib * 2 - 64) << 20))"
    stop_millrace
    fresh_loops 1 $((member_mib * 2))
    echo "qemu-nbd --cache=none --aio=io_uring on the same kind of loop device, on CPU 0" >&2
    taskset -c 0 qemu-nbd --persistent --shared=4 --cache=none --aio=io_uring -f raw -k "$tmp/q.sock" "${loops[0]}" &
    peer=$!
    for _ in $(seq 100); do [[ -S $tmp/q.sock ]] && break; sleep 0.1; done
    nbd_side nbd-qemu "nbd+unix:///?socket=$tmp/q.sock" "$peer" "$(((member_mib * 2 - 64) << 20))"
    kill "$peer"; wait "$peer" 2>/dev/null || true; peer=
else
    echo "fio's nbd engine or qemu-nbd is missing: the NBD part is skipped" >&2
fi

echo
if ((nvme)); then
    h="| NVMe/TCP workload | QD | Millrace on loop devices | on /dev/shm files | fio on the loop devices | Millrace/fio"
    l="|---|---|---|---|---|---"
    [[ " $peers " == *" spdk-aio "* ]] && { h+=" | SPDK AIO on loop devices"; l+="|---"; }
    h+=" | target CPU us/I/O loop / shm | context switches/I/O loop / shm | io-wq punts/I/O loop / shm |"
    l+="|---|---|---|"
    echo "$h"; echo "$l"
    for row in "${nvme_rows[@]}"; do
        read -r w bs qd <<<"$row"
        o="| $w $((bs / 1024))K | $qd | ${iops[blk $row]} | ${iops[mem $row]} | ${iops[fio $row]} | $(ratio "${iops[blk $row]}" "${iops[fio $row]}")"
        [[ " $peers " == *" spdk-aio "* ]] && o+=" | ${iops[spdk $row]}"
        o+=" | ${cpu[blk $row]} / ${cpu[mem $row]} | ${ctx[blk $row]} / ${ctx[mem $row]} | ${wq[blk $row]} / ${wq[mem $row]} |"
        echo "$o"
    done
    echo
fi
if [[ -n ${iops[nbd-mr randread 4k 32]:-} ]]; then
    echo "| NBD workload | QD | Millrace | qemu-nbd | ratio | server CPU us/request Millrace | qemu-nbd | context switches/request Millrace | qemu-nbd | io-wq punts/request Millrace | qemu-nbd |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|"
    for row in "${nbd_rows[@]}"; do
        read -r rw bs qd <<<"$row"
        echo "| $rw $bs | $qd | ${iops[nbd-mr $row]} | ${iops[nbd-qemu $row]} | $(ratio "${iops[nbd-mr $row]}" "${iops[nbd-qemu $row]}") | ${cpu[nbd-mr $row]} | ${cpu[nbd-qemu $row]} | ${ctx[nbd-mr $row]} | ${ctx[nbd-qemu $row]} | ${wq[nbd-mr $row]} | ${wq[nbd-qemu $row]} |"
    done
fi
