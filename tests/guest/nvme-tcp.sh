#!/usr/bin/env bash
# Runs inside the guest (tests/guest/run-in-guest). Proves Millrace's user-space NVMe/TCP target
# against the stock Linux kernel initiator and nvme-cli: discovery (separate port and I/O port),
# connect with several I/O queues with and without header/data digests, Identify, SMART log,
# XFS round trip across a disconnect/reconnect, fio with crc32c verification, discard, and the
# refusal of hosts and subsystems that are not allowed.
#   usage (on the host): cargo build -p millrace-nvmf --example nvmf_target
#          tests/guest/run-in-guest --timeout 900 tests/guest/nvme-tcp.sh [target/debug]
set -euo pipefail
# $1 is cargo's profile folder (target/debug), as scripts/test.sh passes it; examples live below it.
DIR=${1:-$PWD/target/debug}
BIN=$DIR/examples/nvmf_target
[[ -x $BIN ]] || BIN=$DIR/nvmf_target
[[ -x $BIN ]] || { echo "nvme-tcp: nvmf_target is missing under $DIR; build it first (cargo build -p millrace-nvmf --example nvmf_target)"; exit 1; }
NQN=nqn.2024-01.io.millrace:guest-test
HOST=nqn.2014-08.org.nvmexpress:uuid:4d696c6c-7261-6365-0000-000000000001
HOSTID=4d696c6c-7261-6365-0000-000000000001
BADHOST=nqn.2014-08.org.nvmexpress:uuid:4d696c6c-7261-6365-0000-0000000000ff
BADHOSTID=4d696c6c-7261-6365-0000-0000000000ff
work=$(mktemp -d /tmp/nvmetcp.XXXXXX)
t0=$(date +%s)
step() { echo "nvme-tcp: [$(( $(date +%s) - t0 ))s] $*"; }
fail() {
  echo "nvme-tcp: FAILED: $*"
  echo "--- target log (tail) ---"; tail -30 "$work/target.log" 2>/dev/null || true
  echo "--- kernel log (tail) ---"; dmesg | grep -iE 'nvme|xfs' | tail -30 || true
  echo "--- block devices ---"; ls /sys/block /dev/nvme* 2>&1 | tr '\n' ' '; echo
  exit 1
}
cleanup() {
  nvme disconnect-all >/dev/null 2>&1 || true
  [[ -n ${tpid:-} ]] && kill "$tpid" 2>/dev/null || true
}
trap cleanup EXIT

modprobe -a nvme-tcp xfs || fail "cannot load nvme-tcp / xfs"
RUST_LOG=${RUST_LOG:-info} "$BIN" --file "$work/vol.img" --size 512M --nqn "$NQN" --host "$HOST" --port 4420 \
  --discovery-port 8009 > "$work/target.log" 2>&1 &
tpid=$!
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/4420) 2>/dev/null && break; sleep 0.3; done
(exec 3<>/dev/tcp/127.0.0.1/8009) 2>/dev/null || fail "the target did not start listening"
step "target up (pid $tpid)"

common=(-t tcp -a 127.0.0.1 --hostnqn "$HOST" --hostid "$HOSTID")
nvme discover "${common[@]}" -s 8009 > "$work/disc8009" 2>&1 || { cat "$work/disc8009"; fail "nvme discover on the discovery port"; }
grep -q "subnqn: *$NQN" "$work/disc8009" || { cat "$work/disc8009"; fail "discovery (port 8009) does not list $NQN"; }
grep -q "trsvcid: *4420" "$work/disc8009" || { cat "$work/disc8009"; fail "discovery does not name I/O port 4420"; }
nvme discover "${common[@]}" -s 4420 > "$work/disc4420" 2>&1 || { cat "$work/disc4420"; fail "nvme discover on the I/O port"; }
grep -q "subnqn: *$NQN" "$work/disc4420" || fail "discovery (port 4420) does not list $NQN"
nvme discover -t tcp -a 127.0.0.1 -s 8009 --hostnqn "$BADHOST" --hostid "$BADHOSTID" > "$work/discbad" 2>&1 || true
grep -q "$NQN" "$work/discbad" && fail "discovery shows $NQN to a host that is not allowed"
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

connect -g -G
queues=$(cat /sys/class/nvme/$ctrl/queue_count)
[[ $queues -ge 3 ]] || fail "expected an admin queue and at least 2 I/O queues, the kernel has $queues queues"
step "connected with header and data digests: $ctrl ($ns), $queues queues"
nvme id-ctrl "/dev/$ctrl" > "$work/idctrl" || fail "nvme id-ctrl"
grep -qE '^mn +: Millrace' "$work/idctrl" || { head -20 "$work/idctrl"; fail "id-ctrl does not name Millrace as the model"; }
grep -qE '^subnqn +: '"$NQN" "$work/idctrl" || fail "id-ctrl subnqn is not $NQN"
nvme id-ns "$ns" > "$work/idns" || fail "nvme id-ns"
grep -qE '^nsze +: 0x20000$' "$work/idns" || { head -12 "$work/idns"; fail "id-ns size is not 512 MiB of 4 KiB blocks"; }
nvme smart-log "/dev/$ctrl" > "$work/smart" || fail "nvme smart-log"
grep -qiE 'critical_warning[[:space:]]+: 0' "$work/smart" || { cat "$work/smart"; fail "smart-log reports a critical warning"; }
[[ $(blockdev --getss "$ns") == 4096 ]] || fail "logical block size is not 4096"
step "id-ctrl, id-ns, smart-log ok; io_opt $(cat /sys/block/$(basename "$ns")/queue/optimal_io_size)"

mkfs.xfs -q -f "$ns" || fail "mkfs.xfs on $ns"
mkdir -p "$work/mnt"
mount "$ns" "$work/mnt" || fail "mount $ns"
mkdir -p "$work/mnt/data"
for i in 1 2 3; do head -c $((i * 3 * 1024 * 1024 + 12345)) /dev/urandom > "$work/mnt/data/rand$i"; done
cp -r /usr/share/doc/bash "$work/mnt/data/" 2>/dev/null || cp /bin/bash "$work/mnt/data/"
(cd "$work/mnt/data" && find . -type f -exec sha256sum {} + | sort -k2) > "$work/sums"
umount "$work/mnt" || fail "umount"
nvme disconnect -n "$NQN" > /dev/null || fail "nvme disconnect"
for _ in $(seq 50); do [[ -z $(ls /sys/block | grep '^nvme' || true) ]] && break; sleep 0.2; done
step "XFS written ($(wc -l < "$work/sums") files), disconnected"

connect
step "reconnected without digests: $ctrl ($ns)"
mount "$ns" "$work/mnt" || fail "mount after reconnect"
(cd "$work/mnt/data" && find . -type f -exec sha256sum {} + | sort -k2) > "$work/sums2"
cmp -s "$work/sums" "$work/sums2" || { diff "$work/sums" "$work/sums2" | head; fail "files differ after reconnect"; }
umount "$work/mnt"
step "sha256sums match after reconnect"

fio --name=verify --filename="$ns" --direct=1 --ioengine=libaio --iodepth=16 --rw=randwrite \
  --bsrange=4k-128k --size=48M --verify=crc32c --do_verify=1 --verify_fatal=1 \
  --randrepeat=0 --output="$work/fio.out" > /dev/null 2>&1 || { tail -20 "$work/fio.out"; fail "fio verify"; }
grep -q "err= 0" "$work/fio.out" || { tail -20 "$work/fio.out"; fail "fio reported errors"; }
step "fio randwrite 4k-128k with crc32c verify ok"

blkdiscard "$ns" || fail "blkdiscard"
[[ $(head -c 1048576 "$ns" | tr -d '\0' | wc -c) == 0 ]] || fail "blocks read non-zero after discard"
step "blkdiscard ok, discarded blocks read as zeroes"
nvme disconnect -n "$NQN" > /dev/null || fail "nvme disconnect"

if nvme connect -t tcp -a 127.0.0.1 -s 4420 -n "$NQN" --hostnqn "$BADHOST" --hostid "$BADHOSTID" > "$work/bad.out" 2>&1; then
  fail "a host that is not allowed connected"
fi
ls /sys/block | grep -q '^nvme' && fail "a block device appeared for a host that is not allowed"
grep -q "not allowed" "$work/target.log" || fail "the target did not log the refused host"
if nvme connect "${common[@]}" -s 4420 -n nqn.2024-01.io.millrace:nope > "$work/bad2.out" 2>&1; then
  fail "a connect to an unknown subsystem succeeded"
fi
step "refused: host not allowed, unknown subsystem"
kill -0 "$tpid" || fail "the target died"
step "PASS"
