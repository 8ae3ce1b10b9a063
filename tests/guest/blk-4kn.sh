#!/usr/bin/env bash
# run-in-guest: --disk 48M:4096 --disk 48M:4096 --disk 48M:4096 --disk 48M:4096 --disk 48M:4096
# run-in-guest: --disk 64M --disk 64M:4096 --disk 48M:4096
# Runs inside the guest (tests/guest/run-in-guest). A pool on 4Kn members (virtio disks with
# 4096-byte logical blocks, which refuse any I/O that is not 4 KiB aligned) served to the kernel
# initiator: a RAID6 pool (64 KiB strip) on five 4Kn disks, its superblocks where they belong;
# two volumes exported over NVMe/TCP by `millrace serve`; the namespaces' 4096-byte blocks; XFS
# (4 KiB sectors) with files whose checksums match; fio's crc32c-verified random writes of 4 KiB
# (libaio) and 64 KiB (io_uring), O_DIRECT; discards, of whole stripes and of part of one, that
# read back as zeroes with their neighbours intact; the server stopped and the pool imported
# from its drives into a server that never saw it, every byte verified again; then a member
# failed (reads reconstructed), writes to the degraded pool (its partial-parity log) and the
# server killed under them, the member replaced by another 4Kn disk and rebuilt, and a scrub
# that finds every stripe consistent. First, a pool that mixes a 512-byte and a 4Kn member.
#   usage (on the host): cargo build -p millrace-cli -p millrace-server
#          tests/guest/run-in-guest --timeout 1200 tests/guest/blk-4kn.sh $PWD/target/debug
set -euo pipefail
DIR=$(realpath "${1:-$PWD/target/debug}")
MR=$DIR/millrace
[[ -x $MR ]] || { echo "blk-4kn: millrace is missing under $DIR; build it first (cargo build -p millrace-cli -p millrace-server)"; exit 1; }
HOST=nqn.2014-08.org.nvmexpress:uuid:4d696c6c-7261-6365-0000-000000000004
HOSTID=4d696c6c-7261-6365-0000-000000000004
work=$(mktemp -d /tmp/blk4kn.XXXXXX)
export MILLRACE_HOME=$work/home MILLRACE_LOG=${MILLRACE_LOG:-info}
t0=$(date +%s)
step() { echo "blk-4kn: [$(( $(date +%s) - t0 ))s] $*"; }
fail() {
  echo "blk-4kn: FAILED: $*"
  echo "--- server log (tail) ---"; tail -40 "$work/server.log" 2>/dev/null || true
  echo "--- kernel log (tail) ---"; dmesg | grep -iE 'nvme|xfs|vd[a-z]|blk|I/O' | tail -30 || true
  exit 1
}
cleanup() {
  [[ -n ${fpid:-} ]] && kill "$fpid" 2>/dev/null || true
  umount "$work/mnt" 2>/dev/null || true
  nvme disconnect-all >/dev/null 2>&1 || true
  [[ -n ${spid:-} ]] && kill "$spid" 2>/dev/null || true
}
trap cleanup EXIT
modprobe -a nvme-tcp xfs || fail "cannot load nvme-tcp / xfs"

# The disks the runner attached (this script's `# run-in-guest:` lines), in order.
read -ra disks <<< "${RUN_IN_GUEST_DISKS:-}"
((${#disks[@]} == 8)) || fail "expected the runner's 8 virtio disks, RUN_IN_GUEST_DISKS is '${RUN_IN_GUEST_DISKS:-}'"
members=("${disks[@]:0:5}") small512=${disks[5]} small4k=${disks[6]} spare=${disks[7]}
for d in "${members[@]}" "$small4k" "$spare"; do
  [[ $(blockdev --getss "$d") == 4096 ]] || fail "$d has $(blockdev --getss "$d")-byte logical blocks, not 4096"
done
[[ $(blockdev --getss "$small512") == 512 ]] || fail "$small512 has $(blockdev --getss "$small512")-byte logical blocks, not 512"
# A 4Kn disk refuses I/O that is not 4 KiB aligned: what makes this test mean something.
if dd if="$small4k" of=/dev/null bs=512 count=1 iflag=direct status=none 2>/dev/null; then
  fail "$small4k (4096-byte blocks) accepted a 512-byte O_DIRECT read"
fi
step "disks: ${members[*]} $spare (4Kn), $small512 (512), $small4k (4Kn)"

json() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }

# Mixed block sizes: the engine writes its members in 4 KiB-aligned units only, so a member with
# 512-byte blocks and one with 4096-byte blocks can share a pool. What it accepts must work: a
# write at an odd offset reads back, lies on both members at the data offset, and the 4Kn member
# alone still gives it back.
"$MR" pool create mix --level raid1 "$small512" "$small4k" > "$work/mix.out" 2>&1 \
  || { cat "$work/mix.out"; fail "pool create of a raid1 with a 512-byte and a 4Kn member"; }
grep -qi panicked "$work/mix.out" && { cat "$work/mix.out"; fail "pool create of mixed members panicked"; }
head -c 100000 /dev/urandom > "$work/mix.bin"
"$MR" io write mix --offset 4609 --input "$work/mix.bin" > /dev/null || fail "io write to the mixed pool"
"$MR" io read mix --offset 4609 --length 100000 | cmp -s - "$work/mix.bin" || fail "the mixed pool read back different bytes"
off=$("$MR" pool show mix --json | json 'd["members"][0]["data_offset_bytes"]' 2>/dev/null) \
  || { "$MR" pool show mix --json | head -40; fail "pool show --json gives no data offset for member 0"; }
for d in "$small512" "$small4k"; do
  cmp -s <(dd if="$d" bs=4096 skip=$((off / 4096 + 1)) count=26 iflag=direct status=none | tail -c +514 | head -c 100000) "$work/mix.bin" \
    || fail "$d does not hold the mixed pool's bytes at its data offset ($off)"
done
"$MR" pool fail mix "$small512" > /dev/null || fail "pool fail mix $small512"
"$MR" io read mix --offset 4609 --length 100000 | cmp -s - "$work/mix.bin" || fail "the mixed pool's 4Kn member alone read back different bytes"
"$MR" pool destroy mix --yes > /dev/null || fail "pool destroy mix"
# (Destroy erases the members in service; the failed one is left as it was.)
[[ $(dd if="$small4k" bs=4096 count=2 iflag=direct status=none | tr -d '\0' | wc -c) == 0 ]] \
  || fail "$small4k still carries a superblock after pool destroy"
step "mixed 512 + 4096 members: accepted; an odd-offset write lies on both and reads back from the 4Kn one alone"

# The pool on 4Kn members. Its superblocks are two 4 KiB slots at each member's start.
"$MR" pool create tank --level raid6 --strip 64k "${members[@]}" > "$work/pool.out" 2>&1 \
  || { cat "$work/pool.out"; fail "millrace pool create on 4Kn members"; }
for d in "${members[@]}"; do
  dd if="$d" bs=4096 count=2 iflag=direct status=none > "$work/sb" || fail "reading the superblock slots of $d"
  [[ $(head -c 8 "$work/sb") == MILLRACE || $(tail -c +4097 "$work/sb" | head -c 8) == MILLRACE ]] \
    || fail "$d has no superblock in its first two 4 KiB blocks"
done
"$MR" pool show tank --json > "$work/show.json"
state=$(json 'd["state"]' < "$work/show.json")
[[ $state == online ]] || fail "the pool is $state, not online"
# The first volume is for XFS, the second for fio and discards on the raw namespace. Small
# members keep the rebuild and the scrub below (every row of the pool, in the emulated CPU)
# short: 48 MiB each, 141 MiB of pool.
"$MR" volume create tank/fs --size 64M > /dev/null || fail "volume create tank/fs"
"$MR" volume create tank/raw --size 64M > /dev/null || fail "volume create tank/raw"
step "pool tank: raid6, 64 KiB strip, 5 4Kn members, superblocks in place; volumes tank/fs and tank/raw"

start_server() {
  rm -f "$MILLRACE_HOME/server.json"
  "$MR" serve >> "$work/server.log" 2>&1 &
  spid=$!
  for _ in $(seq 150); do
    [[ -s $MILLRACE_HOME/server.json ]] && (exec 3<>/dev/tcp/127.0.0.1/4420) 2>/dev/null && return 0
    kill -0 "$spid" 2>/dev/null || fail "millrace serve exited"
    sleep 0.3
  done
  fail "millrace serve did not start listening on 4420"
}
stop_server() {
  kill -TERM "$spid" || fail "the server is not running"
  for _ in $(seq 150); do kill -0 "$spid" 2>/dev/null || break; sleep 0.2; done
  kill -0 "$spid" 2>/dev/null && fail "the server did not stop within 30 s of SIGTERM"
  wait "$spid" || fail "the server exited with status $? on SIGTERM"
  spid=
}
start_server
for v in fs raw; do
  "$MR" export nvme add "tank/$v" --host "$HOST" > "$work/export-$v.out" 2>&1 \
    || { cat "$work/export-$v.out"; fail "millrace export nvme add tank/$v"; }
done
step "millrace serve up (pid $spid), tank/fs and tank/raw exported to $HOST"

common=(-t tcp -a 127.0.0.1 -s 4420 --hostnqn "$HOST" --hostid "$HOSTID")
# connect VOLUME [NVME-CONNECT-ARGS...]: sets ns, its namespace's block device.
connect() {
  local nqn=nqn.2026-11.dev.millrace:tank.$1 b
  shift
  nvme connect "${common[@]}" -n "$nqn" -i 2 "$@" > "$work/connect.out" 2>&1 || { cat "$work/connect.out"; fail "nvme connect to $nqn $*"; }
  for _ in $(seq 100); do
    # nvmeXnY, whose device (the controller, or the subsystem with native multipath) has the
    # NQN; the hidden multipath nodes nvmeXcYnZ have no /dev entry.
    for b in /sys/block/nvme*n*; do
      [[ -e $b && ! $(basename "$b") =~ c[0-9]+n ]] || continue
      [[ $(cat "$b/device/subsysnqn" 2>/dev/null) == "$nqn" && -b /dev/$(basename "$b") ]] || continue
      ns=/dev/$(basename "$b"); return 0
    done
    sleep 0.2
  done
  ls -l /sys/block; fail "no namespace block device appeared for $nqn"
}
disconnect() {
  nvme disconnect -n "nqn.2026-11.dev.millrace:tank.$1" > /dev/null || fail "nvme disconnect from tank/$1"
  for _ in $(seq 50); do [[ -b $ns ]] || break; sleep 0.2; done
}

connect fs
fsdev=$ns
[[ $(blockdev --getss "$fsdev") == 4096 ]] || fail "the namespace of tank/fs has $(blockdev --getss "$fsdev")-byte logical blocks; a volume on 4Kn members should have 4096"
nvme id-ns "$fsdev" > "$work/idns" || fail "nvme id-ns $fsdev"
grep -qE '^lbaf +0 : .*lbads:12 .*in use' "$work/idns" || { grep lbaf "$work/idns"; fail "id-ns does not say LBA format 0 (4096-byte blocks, lbads 12) is in use"; }
q=/sys/block/$(basename "$fsdev")/queue
# io_min and io_opt are what mkfs.xfs takes its stripe unit and width from: the strip and the
# full stripe (3 data drives). (mkfs.xfs ignores them on a volume this small, and says so.)
[[ $(cat $q/minimum_io_size) == 65536 && $(cat $q/optimal_io_size) == 196608 ]] \
  || fail "the namespace reports io_min $(cat $q/minimum_io_size), io_opt $(cat $q/optimal_io_size); the pool's strip is 65536 and its full stripe 196608"
step "tank/fs: $fsdev, logical $(cat $q/logical_block_size), physical $(cat $q/physical_block_size), io_min $(cat $q/minimum_io_size), io_opt $(cat $q/optimal_io_size), discard granularity $(cat $q/discard_granularity)"

# mkfs.xfs refuses filesystems under 300 MB unless told --unsupported (an option xfsprogs keeps
# for test setups); the kernel mounts a small one as any other.
timeout 600 mkfs.xfs --unsupported -f "$fsdev" > "$work/mkfs.out" 2>&1 || { cat "$work/mkfs.out"; fail "mkfs.xfs on $fsdev (status $?)"; }
grep -qE 'sectsz=4096' "$work/mkfs.out" || { cat "$work/mkfs.out"; fail "mkfs.xfs did not make 4096-byte sectors on the 4Kn pool's volume"; }
mkdir -p "$work/mnt"
mount "$fsdev" "$work/mnt" || fail "mount $fsdev"
mkdir -p "$work/mnt/data"
for i in 1 2 3; do head -c $((i * 3 * 1024 * 1024 + 12345)) /dev/urandom > "$work/mnt/data/rand$i"; done
# One process for the 100 small files (a process start is slow on the emulated CPU).
python3 -c 'import os, sys
for i in range(100):
    with open(f"{sys.argv[1]}/small{i}", "wb") as out:
        out.write(os.urandom(i * 397 % 9000 + 1))' "$work/mnt/data" || fail "writing the small files"
cp /bin/bash "$work/mnt/data/"
sums() { (cd "$work/mnt/data" && find . -type f -exec sha256sum {} + | sort -k2); }
sums > "$work/sums"
umount "$work/mnt" || fail "umount"
echo 3 > /proc/sys/vm/drop_caches
mount "$fsdev" "$work/mnt" || fail "mount $fsdev again"
sums | cmp -s - "$work/sums" || fail "the XFS files read back differently after a remount"
umount "$work/mnt"
disconnect fs
step "XFS: 4096-byte sectors; $(wc -l < "$work/sums") files written, read back identical after a remount"

connect raw
rawdev=$ns
[[ $(blockdev --getss "$rawdev") == 4096 ]] || fail "the namespace of tank/raw has $(blockdev --getss "$rawdev")-byte logical blocks"
rawsize=$(blockdev --getsize64 "$rawdev")
# fio: 4 KiB random writes (libaio) over the first 16 MiB, 64 KiB random writes (io_uring) over
# the next 16, each block with a crc32c header, read back and checked; the same jobs with
# --verify_only check them again later.
fio4k=(--name=w4k --direct=1 --ioengine=libaio --iodepth=16 --rw=randwrite --bs=4k
  --offset=0 --size=16M --verify=crc32c --verify_fatal=1 --randrepeat=1 --randseed=4096)
fio64k=(--name=w64k --direct=1 --ioengine=io_uring --iodepth=8 --rw=randwrite --bs=64k
  --offset=16M --size=16M --verify=crc32c --verify_fatal=1 --randrepeat=1 --randseed=65536)
# Written later: degraded writes of 4-16 KiB (partial stripes, through the partial-parity log)
# at 48 MiB, and paced writes of 4-32 KiB at 56 MiB across a SIGKILL of the server. The
# namespace has a volatile write cache (VWC): only flushed writes are promised to survive a
# crash (what was never flushed may read back as it was before, zeroes here: the volume's
# allocation map reaches the drives at a flush), so these jobs flush: at the end, or after
# every write.
fiodeg=(--name=deg --direct=1 --ioengine=libaio --iodepth=8 --rw=randwrite --bsrange=4k-16k
  --offset=48M --size=8M --verify=crc32c --verify_fatal=1 --randrepeat=1 --randseed=4848)
fiokill=(--name=kill --direct=1 --ioengine=io_uring --iodepth=8 --rw=randwrite --bsrange=4k-32k
  --offset=56M --size=8M --verify=crc32c --verify_fatal=1 --randrepeat=1 --randseed=5656 --fsync=1)
fiojobs=(4k 64k)
# fio_ok OUT [read]: no error, no verify complaint, all of the job's bytes read back (and
# written, unless verify-only).
fio_ok() {
  local io='16\.0MiB'   # fio writes 8 MiB as 8192KiB
  [[ $1 == *deg* || $1 == *kill* ]] && io='8192KiB'
  grep -q "err= 0" "$1" && ! grep -qiE 'verify.*(fail|bad)|crc32c: verify' "$1" \
    && grep -qE "READ: .*io=$io" "$1" && { [[ ${2:-} == read ]] || grep -qE "WRITE: .*io=$io" "$1"; }
}
for j in "${fiojobs[@]}"; do
  declare -n job=fio$j
  timeout 600 fio "${job[@]}" --filename="$rawdev" --do_verify=1 --output="$work/fio-$j.out" > /dev/null 2>&1 \
    || { tail -20 "$work/fio-$j.out"; fail "fio $j randwrite + crc32c verify on $rawdev"; }
  fio_ok "$work/fio-$j.out" || { tail -20 "$work/fio-$j.out"; fail "fio $j randwrite + verify reported errors"; }
  unset -n job
done
step "tank/raw: $rawdev ($rawsize bytes); fio randwrite 4k (libaio) and 64k (io_uring), direct, crc32c verify ok"

# Discards: 8 MiB of whole stripes at 40 MiB, and 200 KiB from 4 KiB into a 1 MiB run of data at
# 33 MiB (parts of stripes, which the pool must zero by writing). Both read back as zeroes; the
# bytes around the partial one are untouched.
mib=$((1 << 20))
head -c $((8 * mib)) /dev/urandom | dd of="$rawdev" bs=1M seek=40 oflag=direct status=none || fail "writing 8 MiB at 40 MiB"
head -c "$mib" /dev/urandom > "$work/edge.bin"
dd if="$work/edge.bin" of="$rawdev" bs=1M seek=33 oflag=direct status=none || fail "writing 1 MiB at 33 MiB"
timeout 300 blkdiscard -o $((40 * mib)) -l $((8 * mib)) "$rawdev" || fail "blkdiscard of 8 MiB at 40 MiB"
timeout 300 blkdiscard -o $((33 * mib + 4096)) -l $((200 << 10)) "$rawdev" || fail "blkdiscard of 200 KiB at 33 MiB + 4 KiB"
head -c 4096 "$work/edge.bin" > "$work/edge.want"
head -c $((200 << 10)) /dev/zero >> "$work/edge.want"
tail -c +$((4096 + (200 << 10) + 1)) "$work/edge.bin" >> "$work/edge.want"
check_discards() {
  [[ $(dd if="$rawdev" bs=1M skip=40 count=8 iflag=direct status=none | tr -d '\0' | wc -c) == 0 ]] \
    || fail "the 8 MiB discarded at 40 MiB do not read as zeroes ($1)"
  dd if="$rawdev" bs=1M skip=33 count=1 iflag=direct status=none | cmp -s - "$work/edge.want" \
    || fail "the 1 MiB at 33 MiB is not its data with 200 KiB of zeroes from 4 KiB on ($1)"
}
check_discards "after the discards"
step "blkdiscard: 8 MiB of whole stripes and 200 KiB inside stripes read as zeroes, neighbours intact"
dd if="$rawdev" bs=1M count=48 iflag=direct status=none | sha256sum > "$work/raw.sum"
disconnect raw

# The pool leaves this server and is imported from its drives into a server that never saw it.
stop_server
home1=$MILLRACE_HOME
export MILLRACE_HOME=$work/home2
"$MR" pool import "${members[@]}" > "$work/import.out" 2>&1 || { cat "$work/import.out"; fail "pool import of the 4Kn members"; }
[[ $("$MR" pool show tank --json | json 'd["state"]') == online ]] || fail "the imported pool is not online"
start_server
"$MR" export nvme list --json > "$work/list.json" || fail "export nvme list"
for v in fs raw; do
  grep -q "\"nqn\": \"nqn.2026-11.dev.millrace:tank.$v\"" "$work/list.json" \
    || { cat "$work/list.json"; fail "the export of tank/$v did not come with the imported pool"; }
done
step "server stopped; pool imported from its 4Kn drives into a new server (home2), exports with it"

# verify WHEN: every byte written so far, as written.
verify_all() {
  connect raw; rawdev=$ns
  for j in "${fiojobs[@]}"; do
    declare -n job=fio$j
    timeout 600 fio "${job[@]}" --filename="$rawdev" --verify_only --output="$work/fio-$j-v.out" > /dev/null 2> "$work/fio-$j-v.err" \
      || { head -30 "$work/fio-$j-v.out"; head "$work/fio-$j-v.err"; fail "fio $j verify $1"; }
    fio_ok "$work/fio-$j-v.out" read || { head -30 "$work/fio-$j-v.out"; head "$work/fio-$j-v.err"; fail "fio $j verify $1 reported errors"; }
    unset -n job
  done
  check_discards "$1"
  dd if="$rawdev" bs=1M count=48 iflag=direct status=none | sha256sum | cmp -s - "$work/raw.sum" \
    || fail "the first 48 MiB of tank/raw read differently $1"
  disconnect raw
  connect fs; fsdev=$ns
  mount "$fsdev" "$work/mnt" || fail "mount tank/fs $1"
  sums | cmp -s - "$work/sums" || { sums | diff - "$work/sums" | head; fail "the XFS files differ $1"; }
  umount "$work/mnt"
  disconnect fs
}
verify_all "after the import"
step "after the import: fio verify, discarded ranges, raw checksum and XFS files all as written"

# A member fails: reads are reconstructed from the other four. Then another 4Kn disk replaces it
# and is rebuilt, and a scrub checks every stripe's P and Q on the 4Kn members.
"$MR" pool fail tank "${members[2]}" > "$work/fail.out" 2>&1 || { cat "$work/fail.out"; fail "pool fail tank ${members[2]}"; }
grep -q '"state": "degraded"' <("$MR" pool show tank --json) || fail "the pool is not degraded after a member failed"
verify_all "with ${members[2]} failed"
step "${members[2]} failed: everything still verifies (reconstructed reads)"

# Degraded writes, then the server killed (SIGKILL) under degraded writes and started again: its
# partial-parity log is recovered from the 4Kn members, the host reconnects and resends what
# was in flight, and fio's verify of both sees every block as written.
connect raw; rawdev=$ns
nvme id-ctrl "$rawdev" | grep -qE '^vwc +: 0x1' || fail "the controller does not report a volatile write cache; the flushes below assume one"
timeout 600 fio "${fiodeg[@]}" --filename="$rawdev" --do_verify=1 --end_fsync=1 --output="$work/fio-deg.out" > /dev/null 2>&1 \
  || { tail -20 "$work/fio-deg.out"; fail "fio degraded randwrite 4k-16k + verify"; }
fio_ok "$work/fio-deg.out" || { tail -20 "$work/fio-deg.out"; fail "fio degraded randwrite reported errors"; }
fiojobs+=(deg)
disconnect raw
connect raw --reconnect-delay=1 --ctrl-loss-tmo=120; rawdev=$ns
# The region already holds data (flushed), as a disk in use does: a write the kill interrupts
# between its completion and the next flush then cannot fall back to a never-written granule.
head -c $((8 * mib)) /dev/urandom | dd of="$rawdev" bs=1M seek=56 oflag=direct conv=fsync status=none || fail "filling 56-64 MiB"
timeout 900 fio "${fiokill[@]}" --filename="$rawdev" --do_verify=1 --rate=,1m --output="$work/fio-kill.out" > /dev/null 2>&1 &
fpid=$!
sleep 3
kill -0 "$fpid" 2>/dev/null || { cat "$work/fio-kill.out"; fail "fio ended before the server could be killed under it"; }
kill -KILL "$spid"; wait "$spid" 2>/dev/null || true
spid=
start_server
grep -q "from the partial-parity log" "$work/server.log" || fail "the server, killed under degraded writes, recovered nothing from the partial-parity log"
wait "$fpid" || { tail -20 "$work/fio-kill.out"; fail "fio verify across a SIGKILL of the server (degraded pool) exited with an error"; }
fpid=
fio_ok "$work/fio-kill.out" || { tail -20 "$work/fio-kill.out"; fail "fio reported errors across a SIGKILL of the server"; }
fiojobs+=(kill)
disconnect raw
step "degraded writes 4-16k verified; the server killed under degraded writes and restarted: the host resent, verify ok"
timeout 600 "$MR" pool replace tank "${members[2]}" "$spare" > "$work/replace.out" 2>&1 \
  || { cat "$work/replace.out"; fail "pool replace tank ${members[2]} $spare"; }
for _ in $(seq 300); do
  [[ $("$MR" pool show tank --json | json 'd["state"]') == online ]] && break
  sleep 1
done
"$MR" pool show tank --json > "$work/show2.json"
[[ $(json 'd["state"]' < "$work/show2.json") == online ]] || { cat "$work/replace.out"; head -30 "$work/show2.json"; fail "the pool is not online within 300 s of the replace"; }
grep -q "\"$spare\"" "$work/show2.json" || fail "$spare is not a member after the replace"
"$MR" pool scrub tank --json > "$work/scrub.json" 2> "$work/scrub.err" || { cat "$work/scrub.err" "$work/scrub.json"; fail "pool scrub tank"; }
[[ $(json 'd["rows_checked"] > 0 and d["mismatches"] == 0 and d["skipped_degraded"] == 0' < "$work/scrub.json") == True ]] \
  || { cat "$work/scrub.json"; fail "the scrub after the rebuild did not find every stripe consistent"; }
verify_all "after the rebuild onto $spare"
kill -0 "$spid" || fail "the server died"
stop_server
step "replaced by $spare (4Kn) and rebuilt; scrub clean; everything verifies"
export MILLRACE_HOME=$home1
step "PASS"
