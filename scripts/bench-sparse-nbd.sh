#!/usr/bin/env bash
# Copying a sparse image onto an NBD export (issue #17): nbdcopy and qemu-img convert of a 1 GiB
# image holding 8 MiB of data, to a Millrace RAID6 volume (6 drive files in /dev/shm, 64 KiB
# strips) and to nbdkit's file plugin over a sparse file in /dev/shm, each server pinned to CPU 0
# and the copying tool to CPU 1. Reports seconds (best of RUNS), the ratio, and the bytes that
# reached the drive files (du), which shows that the zero runs never did.
# Timing: run it on a quiet machine (nothing else compiling).
# Usage: scripts/bench-sparse-nbd.sh [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
for tool in nbdkit nbdcopy qemu-img taskset; do
    command -v "$tool" >/dev/null || { echo "$tool is not installed: run scripts/setup.sh" >&2; exit 1; }
done
source scripts/bench-lib.sh
[[ -n ${MILLRACE_BIN:-} ]] || cargo build --release -q -p millrace-cli -p millrace-server
tmp=$(mktemp -d)
peer=
peer_img=/dev/shm/nbdkit-sparse-$$.img
cleanup() {
    stop_millrace
    [[ -n $peer ]] && kill "$peer" 2>/dev/null && wait "$peer" 2>/dev/null
    rm -rf "$tmp" "$peer_img"
}
trap cleanup EXIT

img=$tmp/sparse.img
truncate -s 1G "$img"
for at in 0 300 700 1000; do dd if=/dev/urandom of="$img" bs=1M count=2 seek=$at conv=notrunc status=none; done

# best URI TOOL: the best of $runs copies, in seconds
best() {
    local b=
    for _ in $(seq "$runs"); do
        local t0 t1
        t0=$(date +%s.%N)
        if [[ $2 == nbdcopy ]]; then
            taskset -c 1 nbdcopy "$img" "$1"
        else
            taskset -c 1 qemu-img convert -n -f raw -O raw "$img" "$1"
        fi
        t1=$(date +%s.%N)
        b=$(awk -v a="$t0" -v z="$t1" -v b="$b" 'BEGIN { d = z - a; if (b == "" || d < b) b = d; printf "%.3f", b }')
    done
    echo "$b"
}

VOL_SIZE=1G start_millrace "$tmp/home" 0 raid6 6 "320M" --no-nvme --api 127.0.0.1:8747
"$m" export nbd add bench/v --name v >/dev/null
uri="nbd+unix:///v?socket=$MILLRACE_HOME/nbd.sock"
before=$(du -B1 -c /dev/shm/millrace-bench-$$-*.img | tail -1 | cut -f1)
mr_copy=$(best "$uri" nbdcopy)
mr_qemu=$(best "$uri" qemu-img)
after=$(du -B1 -c /dev/shm/millrace-bench-$$-*.img | tail -1 | cut -f1)
cmp <(nbdcopy "$uri" - | head -c $((1 << 30))) "$img" || { echo "the copy on Millrace differs from the image" >&2; exit 1; }
stop_millrace

truncate -s 1G "$peer_img"
taskset -c 0 nbdkit -f -U "$tmp/peer.sock" file "$peer_img" &
peer=$!
for _ in $(seq 100); do [[ -S $tmp/peer.sock ]] && break; sleep 0.1; done
puri="nbd+unix:///?socket=$tmp/peer.sock"
nk_copy=$(best "$puri" nbdcopy)
nk_qemu=$(best "$puri" qemu-img)
cmp "$peer_img" "$img" || { echo "the copy on nbdkit differs from the image" >&2; exit 1; }

echo "| tool | Millrace RAID6 (s) | nbdkit file (s) | ratio (nbdkit time / Millrace time) |"
echo "|---|---|---|---|"
echo "| nbdcopy | $mr_copy | $nk_copy | $(ratio "$nk_copy" "$mr_copy") |"
echo "| qemu-img convert | $mr_qemu | $nk_qemu | $(ratio "$nk_qemu" "$mr_qemu") |"
echo
echo "bytes that reached Millrace's 6 drive files (the same image copied $((runs * 2)) times): $((after - before)) (8 MiB of data x 6/4 = $(( (8 << 20) * 6 / 4 )) once)"
echo "bytes allocated in nbdkit's file: $(du -B1 "$peer_img" | cut -f1)"
