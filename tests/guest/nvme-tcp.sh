#!/usr/bin/env bash
# run-in-guest: --disk 112M --disk 112M --disk 112M --disk 112M --disk 112M --disk 112M
# run-in-guest: --disk 32M --disk 32M --disk 32M --disk 32M
# Runs inside the guest (tests/guest/run-in-guest). Proves `millrace serve` (the product, not a
# test daemon) against the stock Linux kernel initiator and nvme-cli over the guest's loopback:
# a RAID6 pool on six virtio disks (block devices), a volume exported to one host NQN; discovery
# (separate port and I/O port), connect with several I/O queues with and without header/data
# digests, Identify, SMART log, XFS round trip across a disconnect/reconnect, fio with crc32c
# verification, discard; a drive failed with `millrace pool fail` during fio and then a second
# one, both invisible to the client; the export served again after a server restart with the data
# intact; fio's verified 4 KiB writes to a RAID10 pool on four more disks, read back again with
# one copy of each mirror failed; and the refusal of hosts and subsystems that are not allowed.
#   usage (on the host): cargo build -p millrace-cli -p millrace-server
#          tests/guest/run-in-guest --timeout 1200 tests/guest/nvme-tcp.sh $PWD/target/debug
set -euo pipefail
# $1 is cargo's profile folder (target/debug), as scripts/test.sh passes it.
DIR=$(realpath "${1:-$PWD/target/debug}")
MR=$DIR/millrace
[[ -x $MR ]] || { echo "nvme-tcp: millrace is missing under $DIR; build it first (cargo build -p millrace-cli -p millrace-server)"; exit 1; }
HOST=nqn.2014-08.org.nvmexpress:uuid:4d696c6c-7261-6365-0000-000000000001
HOSTID=4d696c6c-7261-6365-0000-000000000001
BADHOST=nqn.2014-08.org.nvmexpress:uuid:4d696c6c-7261-6365-0000-0000000000ff
BADHOSTID=4d696c6c-7261-6365-0000-0000000000ff
NQN=nqn.2026-11.dev.millrace:tank.scratch   # the default subsystem NQN of tank/scratch
work=$(mktemp -d /tmp/nvmetcp.XXXXXX)       # /tmp is tmpfs in the guest
export MILLRACE_HOME=$work/home MILLRACE_LOG=${MILLRACE_LOG:-info}
t0=$(date +%s)
step() { echo "nvme-tcp: [$(( $(date +%s) - t0 ))s] $*"; }
fail() {
  echo "nvme-tcp: FAILED: $*"
  echo "--- server log (tail) ---"; tail -40 "$work/server.log" 2>/dev/null || true
  echo "--- kernel log (tail) ---"; dmesg | grep -iE 'nvme|xfs' | tail -30 || true
  echo "--- block devices ---"; ls /sys/block /dev/nvme* 2>&1 | tr '\n' ' '; echo
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

# The pool, the volume and the export, as a user makes them. The drives: the runner's virtio
# disks (this script's `# run-in-guest:` lines), six for tank and four for the RAID10 pool.
read -ra disks <<< "${RUN_IN_GUEST_DISKS:-}"
((${#disks[@]} == 10)) || fail "expected the runner's 10 virtio disks, RUN_IN_GUEST_DISKS is '${RUN_IN_GUEST_DISKS:-}'"
drives=("${disks[@]:0:6}") fdrives=("${disks[@]:6:4}")
"$MR" pool create tank --level raid6 --strip 64k "${drives[@]}" > "$work/pool.out" 2>&1 \
  || { cat "$work/pool.out"; fail "millrace pool create on ${drives[*]}"; }
# XFS needs 300 MB at least.
"$MR" volume create tank/scratch --size 320M > /dev/null || fail "millrace volume create"
size=$("$MR" volume show tank/scratch --json | sed -n 's/^ *"size_bytes": *\([0-9]*\),\?$/\1/p')
[[ $size =~ ^[0-9]+$ ]] || fail "volume show --json gives no size_bytes"
step "pool tank (raid6, 6 drives) and volume tank/scratch of $size bytes"

start_server() {
  "$MR" serve >> "$work/server.log" 2>&1 &
  spid=$!
  for _ in $(seq 150); do
    [[ -s $MILLRACE_HOME/server.json ]] && (exec 3<>/dev/tcp/127.0.0.1/4420) 2>/dev/null \
      && (exec 3<>/dev/tcp/127.0.0.1/8009) 2>/dev/null && return 0
    kill -0 "$spid" 2>/dev/null || fail "millrace serve exited"
    sleep 0.3
  done
  fail "millrace serve did not start listening on 4420 and 8009"
}
stop_server() {
  kill -TERM "$spid" || fail "the server is not running"
  for _ in $(seq 150); do kill -0 "$spid" 2>/dev/null || break; sleep 0.2; done
  kill -0 "$spid" 2>/dev/null && fail "the server did not stop within 30 s of SIGTERM"
  wait "$spid" || fail "the server exited with status $? on SIGTERM"
  spid=
}
start_server
step "millrace serve up (pid $spid)"
"$MR" export nvme add tank/scratch --host "$HOST" > "$work/export.out" 2>&1 \
  || { cat "$work/export.out"; fail "millrace export nvme add"; }
grep -q "$NQN" "$work/export.out" || { cat "$work/export.out"; fail "the export is not named $NQN"; }
step "exported to $HOST only"

common=(-t tcp -a 127.0.0.1 --hostnqn "$HOST" --hostid "$HOSTID")
nvme discover "${common[@]}" -s 8009 > "$work/disc8009" 2>&1 || { cat "$work/disc8009"; fail "nvme discover on the discovery port"; }
grep -q "subnqn: *$NQN" "$work/disc8009" || { cat "$work/disc8009"; fail "discovery (port 8009) does not list $NQN"; }
grep -q "trsvcid: *4420" "$work/disc8009" || { cat "$work/disc8009"; fail "discovery does not name I/O port 4420"; }
nvme discover "${common[@]}" -s 4420 > "$work/disc4420" 2>&1 || { cat "$work/disc4420"; fail "nvme discover on the I/O port"; }
grep -q "subnqn: *$NQN" "$work/disc4420" || fail "discovery (port 4420) does not list $NQN"
# A stranger may use discovery (its subsystem is open to any host) and is shown nothing: the
# command succeeds with an empty log. Its Connect to the subsystem is refused further down.
nvme discover -t tcp -a 127.0.0.1 -s 8009 --hostnqn "$BADHOST" --hostid "$BADHOSTID" > "$work/discbad" 2>&1 \
  || { cat "$work/discbad"; fail "discovery failed for a host that is not allowed (it should succeed and list nothing)"; }
grep -q "Number of Records 0," "$work/discbad" || { cat "$work/discbad"; fail "discovery does not give an empty log to a host that is not allowed"; }
grep -q "subnqn" "$work/discbad" && { cat "$work/discbad"; fail "discovery lists entries to a host that is not allowed"; }
step "discovery: listed on both ports, hidden from a stranger"

find_ns() {
  local dev
  for _ in $(seq 100); do
    for c in /sys/class/nvme/nvme*; do
      [[ -e $c/subsysnqn ]] || continue
      [[ $(cat "$c/subsysnqn") == "$NQN" ]] || continue
      ctrl=$(basename "$c")
      # With native multipath the kernel also lists the hidden path node nvmeXcYnZ, which has no
      # /dev entry; the namespace is the nvmeXnZ one.
      dev=$(ls -d /sys/block/nvme*n1 2>/dev/null | grep -v 'c[0-9]*n1$' | head -1)
      [[ -n $dev && -b /dev/$(basename "$dev") ]] && { ns=/dev/$(basename "$dev"); return 0; }
    done
    sleep 0.2
  done
  return 1
}
connect() {
  nvme connect "${common[@]}" -s 4420 -n "$NQN" -i 2 "$@" > "$work/connect.out" 2>&1 \
    || { cat "$work/connect.out"; fail "nvme connect $*"; }
  find_ns || fail "no namespace block device appeared after nvme connect $*"
}
disconnect() {
  nvme disconnect -n "$NQN" > /dev/null || fail "nvme disconnect"
  for _ in $(seq 50); do [[ -z $(ls /sys/block | grep '^nvme' || true) ]] && break; sleep 0.2; done
}

connect -g -G
queues=$(cat /sys/class/nvme/$ctrl/queue_count)
[[ $queues -ge 3 ]] || fail "expected an admin queue and at least 2 I/O queues, the kernel has $queues queues"
step "connected with header and data digests: $ctrl ($ns), $queues queues"
nvme id-ctrl "/dev/$ctrl" > "$work/idctrl" || fail "nvme id-ctrl"
grep -qE '^mn +: Millrace' "$work/idctrl" || { head -20 "$work/idctrl"; fail "id-ctrl does not name Millrace as the model"; }
grep -qE '^subnqn +: '"$NQN" "$work/idctrl" || fail "id-ctrl subnqn is not $NQN"
nvme id-ns "$ns" > "$work/idns" || fail "nvme id-ns"
nsze=$(printf '0x%x' $((size / 4096)))
grep -qE "^nsze +: $nsze\$" "$work/idns" || { head -12 "$work/idns"; fail "id-ns size is not $nsze 4 KiB blocks ($size bytes, the volume's size)"; }
[[ $(blockdev --getsize64 "$ns") == "$size" ]] || fail "the block device is $(blockdev --getsize64 "$ns") bytes, the volume $size"
nvme smart-log "/dev/$ctrl" > "$work/smart" || fail "nvme smart-log"
grep -qiE 'critical_warning[[:space:]]+: 0' "$work/smart" || { cat "$work/smart"; fail "smart-log reports a critical warning"; }
[[ $(blockdev --getss "$ns") == 4096 ]] || fail "logical block size is not 4096"
step "id-ctrl, id-ns ($nsze blocks), smart-log ok; io_opt $(cat /sys/block/$(basename "$ns")/queue/optimal_io_size)"

# Deallocation is bounded per command (DMRSL), so mkfs.xfs's and blkdiscard's discards of the
# whole device arrive in pieces that each finish well inside the kernel's 30 s I/O timeout.
dmax=$(cat /sys/block/$(basename "$ns")/queue/discard_max_hw_bytes)
(( dmax > 0 && dmax <= 64 << 20 )) || fail "the kernel may send $dmax bytes in one discard; the target should limit it (DMRSL)"
timeout 600 mkfs.xfs -q -f "$ns" || fail "mkfs.xfs on $ns (status $?)"
mkdir -p "$work/mnt"
mount "$ns" "$work/mnt" || fail "mount $ns"
mkdir -p "$work/mnt/data"
for i in 1 2 3; do head -c $((i * 3 * 1024 * 1024 + 12345)) /dev/urandom > "$work/mnt/data/rand$i"; done
cp -r /usr/share/doc/bash "$work/mnt/data/" 2>/dev/null || cp /bin/bash "$work/mnt/data/"
(cd "$work/mnt/data" && find . -type f -exec sha256sum {} + | sort -k2) > "$work/sums"
umount "$work/mnt" || fail "umount"
disconnect
step "XFS written ($(wc -l < "$work/sums") files), disconnected"

connect
step "reconnected without digests: $ctrl ($ns)"
mount "$ns" "$work/mnt" || fail "mount after reconnect"
(cd "$work/mnt/data" && find . -type f -exec sha256sum {} + | sort -k2) > "$work/sums2"
cmp -s "$work/sums" "$work/sums2" || { diff "$work/sums" "$work/sums2" | head; fail "files differ after reconnect"; }
umount "$work/mnt"
step "sha256sums match after reconnect"

timeout 600 blkdiscard -f "$ns" || fail "blkdiscard (status $?)"
[[ $(head -c 1048576 "$ns" | tr -d '\0' | wc -c) == 0 ]] || fail "blocks read non-zero after discard"
[[ $(dd if="$ns" bs=1M skip=$((size / 1048576 - 1)) count=1 iflag=direct status=none | tr -d '\0' | wc -c) == 0 ]] \
  || fail "the last MiB reads non-zero after discard"
step "blkdiscard ok, discarded blocks read as zeroes"

# fio writes 4k-128k blocks with crc32c headers at random offsets of the first 32 MiB, then reads
# them back and checks them; the same job with --verify_only checks them again later.
fiojob=(--name=verify --filename="$ns" --direct=1 --ioengine=libaio --iodepth=16 --rw=randwrite
  --bsrange=4k-128k --size=32M --verify=crc32c --verify_fatal=1 --randrepeat=1 --randseed=20261122)
# ok: no error, no verify complaint, and all 32 MiB read back (written too, unless verify-only).
fio_ok() {
  grep -q "err= 0" "$1" && ! grep -qiE 'verify.*(fail|bad)|crc32c: verify' "$1" \
    && grep -qE 'READ: .*io=32\.0MiB' "$1" && { [[ ${2:-} == read ]] || grep -qE 'WRITE: .*io=32\.0MiB' "$1"; }
}
# The writes are paced (2 MB/s: 16 s for 32 MiB) so the drive fails while they are in flight.
timeout 900 fio "${fiojob[@]}" --do_verify=1 --rate=,2m --output="$work/fio1.out" > /dev/null 2>&1 &
fpid=$!
sleep 4
kill -0 "$fpid" 2>/dev/null || { cat "$work/fio1.out"; fail "fio ended before a drive could be failed under it"; }
"$MR" pool fail tank "${drives[2]}" > "$work/fail1.out" 2>&1 || { cat "$work/fail1.out"; fail "millrace pool fail tank ${drives[2]}"; }
kill -0 "$fpid" 2>/dev/null || fail "fio ended before the drive failure took effect; the test proved nothing"
step "failed ${drives[2]} while fio writes"
wait "$fpid" || { tail -20 "$work/fio1.out"; fail "fio verify across a drive failure exited with an error"; }
fpid=
fio_ok "$work/fio1.out" || { tail -20 "$work/fio1.out"; fail "fio reported errors across a drive failure"; }
"$MR" pool show tank --json > "$work/show1.json" || fail "millrace pool show"
grep -q '^  "state": "degraded"' "$work/show1.json" || { head -20 "$work/show1.json"; fail "pool show does not say degraded after a drive failed"; }
step "fio randwrite 4k-128k + crc32c verify ok across the failure; pool degraded"

"$MR" pool fail tank "${drives[4]}" > "$work/fail2.out" 2>&1 || { cat "$work/fail2.out"; fail "millrace pool fail tank ${drives[4]}"; }
[[ $(grep -c '"state": "faulty"' <("$MR" pool show tank --json)) == 2 ]] || fail "pool show does not list two faulty drives"
timeout 600 fio "${fiojob[@]}" --verify_only --output="$work/fio2.out" > /dev/null 2>&1 \
  || { tail -20 "$work/fio2.out"; fail "fio read-verify with two drives failed"; }
fio_ok "$work/fio2.out" read || { tail -20 "$work/fio2.out"; fail "fio read-verify with two drives failed reported errors"; }
dd if="$ns" bs=1M count=64 iflag=direct status=none | sha256sum > "$work/raw.sum"
step "second drive failed: read-verify still ok"

disconnect
stop_server
step "server stopped (SIGTERM)"
start_server
step "server restarted (pid $spid)"
"$MR" export nvme list --json > "$work/list.json" || fail "millrace export nvme list"
grep -q "\"nqn\": \"$NQN\"" "$work/list.json" || { cat "$work/list.json"; fail "the export is gone after a restart"; }
grep -q '"serving": true' "$work/list.json" || { cat "$work/list.json"; fail "the export is not served after a restart"; }
connect -g
timeout 600 fio "${fiojob[@]}" --verify_only --output="$work/fio3.out" > /dev/null 2>&1 \
  || { tail -20 "$work/fio3.out"; fail "fio read-verify after the restart"; }
fio_ok "$work/fio3.out" read || { tail -20 "$work/fio3.out"; fail "fio read-verify after the restart reported errors"; }
dd if="$ns" bs=1M count=64 iflag=direct status=none | sha256sum | cmp -s - "$work/raw.sum" \
  || fail "the first 64 MiB read differently after the restart"
grep -q '"host": "'"$HOST"'"' <("$MR" export list --json) || fail "export list does not show the connected host"
disconnect
step "after the restart: export served, reconnected, data verified"

# The host's own recoveries under load: `nvme reset` of its controller, and the server going away
# and coming back (as after a network blip: the host keeps the namespace, reconnects every
# second and requeues what was in flight). fio's paced, verified writes see neither.
connect --reconnect-delay=1 --ctrl-loss-tmo=120
timeout 900 fio "${fiojob[@]}" --filename="$ns" --do_verify=1 --rate=,1m --output="$work/fio5.out" > /dev/null 2>&1 &
fpid=$!
sleep 4
kill -0 "$fpid" 2>/dev/null || { cat "$work/fio5.out"; fail "fio ended before the controller reset"; }
nvme reset "/dev/$ctrl" || fail "nvme reset /dev/$ctrl"
sleep 4
kill -0 "$fpid" 2>/dev/null || { cat "$work/fio5.out"; fail "fio ended before the server restart under it"; }
stop_server
start_server
wait "$fpid" || { tail -20 "$work/fio5.out"; fail "fio verify across nvme reset and a server restart exited with an error"; }
fio_ok "$work/fio5.out" || { tail -20 "$work/fio5.out"; fail "fio reported errors across nvme reset and a server restart"; }
[[ -b $ns ]] || fail "the namespace went away across the server restart"
disconnect
step "nvme reset and a server restart under fio: the host recovered, verify ok"

# A RAID10 pool (two mirrored pairs) on four more disks: fio's verified 4 KiB random writes,
# read back and checked again with one disk of each pair failed.
"$MR" pool create fast --level raid10 --strip 64k "${fdrives[@]}" > "$work/fpool.out" 2>&1 \
  || { cat "$work/fpool.out"; fail "millrace pool create fast (raid10) on ${fdrives[*]}"; }
"$MR" volume create fast/v --size 48M > /dev/null || fail "millrace volume create fast/v"
"$MR" export nvme add fast/v --host "$HOST" > /dev/null || fail "millrace export nvme add fast/v"
tankqn=$NQN
NQN=nqn.2026-11.dev.millrace:fast.v
connect
fastjob=(--name=fast --filename="$ns" --direct=1 --ioengine=libaio --iodepth=16 --rw=randwrite
  --bs=4k --size=16M --verify=crc32c --verify_fatal=1 --randrepeat=1)
timeout 600 fio "${fastjob[@]}" --do_verify=1 --output="$work/fio4.out" > /dev/null 2>&1 \
  || { tail -20 "$work/fio4.out"; fail "fio 4k randwrite + verify on fast/v"; }
grep -q "err= 0" "$work/fio4.out" && ! grep -qiE 'verify.*(fail|bad)|crc32c: verify' "$work/fio4.out" \
  && grep -qE 'WRITE: .*io=16\.0MiB' "$work/fio4.out" || { tail -20 "$work/fio4.out"; fail "fio on fast/v reported errors"; }
for d in "${fdrives[0]}" "${fdrives[3]}"; do
  "$MR" pool fail fast "$d" > "$work/ffail.out" 2>&1 || { cat "$work/ffail.out"; fail "millrace pool fail fast $d"; }
done
timeout 600 fio "${fastjob[@]}" --verify_only --output="$work/fio4v.out" > /dev/null 2>&1 \
  || { tail -20 "$work/fio4v.out"; fail "fio read-verify on fast/v with one disk of each mirror failed"; }
grep -q "err= 0" "$work/fio4v.out" && ! grep -qiE 'verify.*(fail|bad)|crc32c: verify' "$work/fio4v.out" \
  && grep -qE 'READ: .*io=16\.0MiB' "$work/fio4v.out" || { tail -20 "$work/fio4v.out"; fail "fio read-verify on fast/v reported errors"; }
disconnect
NQN=$tankqn
step "raid10 on four disks: fio 4k randwrite + verify ok, and again with ${fdrives[0]} and ${fdrives[3]} failed"

if nvme connect -t tcp -a 127.0.0.1 -s 4420 -n "$NQN" --hostnqn "$BADHOST" --hostid "$BADHOSTID" > "$work/bad.out" 2>&1; then
  fail "a host that is not allowed connected"
fi
ls /sys/block | grep '^nvme' >/dev/null && fail "a block device appeared for a host that is not allowed"
grep "refused a Connect: the host is not allowed" "$work/server.log" | grep -q "$BADHOST" \
  || fail "the server did not refuse $BADHOST at Connect (its log says nothing of it)"
if nvme connect "${common[@]}" -s 4420 -n nqn.2026-11.dev.millrace:tank.nope > "$work/bad2.out" 2>&1; then
  fail "a connect to an unknown subsystem succeeded"
fi
ls /sys/block | grep '^nvme' >/dev/null && fail "a block device appeared for an unknown subsystem"
step "refused: host not allowed, unknown subsystem"
kill -0 "$spid" || fail "the server died"
stop_server
step "PASS"
