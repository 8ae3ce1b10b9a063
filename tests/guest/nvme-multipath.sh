#!/usr/bin/env bash
# run-in-guest: --disk 96M --disk 96M --disk 96M
# Runs inside the guest (tests/guest/run-in-guest). Proves NVMe/TCP multipath and ANA against the
# stock Linux initiator with native multipath: a RAID5 pool on three virtio disks the runner
# attaches, `millrace serve` with two listeners (127.0.0.1:4420
# and :4421), discovery listing both, `nvme connect` to each, one multipath block device with two
# optimized paths; fio writing with crc32c verification while (a) one path's ANA state goes
# inaccessible (the kernel moves I/O to the other path) and back to optimized, and (b) one path's
# controller is disconnected and connected again, with no I/O error and every byte verified; a
# read-verify while the other path is inaccessible; `export list` and /metrics naming the paths
# and states; a bad ANA request refused; and a volume grown while connected showing its new size
# without reconnecting.
#   usage (on the host): cargo build -p millrace-cli -p millrace-server
#          tests/guest/run-in-guest --timeout 1200 tests/guest/nvme-multipath.sh $PWD/target/debug
set -euo pipefail
DIR=$(realpath "${1:-$PWD/target/debug}")
MR=$DIR/millrace
[[ -x $MR ]] || { echo "nvme-multipath: millrace is missing under $DIR; build it first (cargo build -p millrace-cli -p millrace-server)"; exit 1; }
HOST=nqn.2014-08.org.nvmexpress:uuid:4d696c6c-7261-6365-0000-000000000049
HOSTID=4d696c6c-7261-6365-0000-000000000049
NQN=nqn.2026-11.dev.millrace:tank.mp
A=127.0.0.1:4420 B=127.0.0.1:4421
work=$(mktemp -d /tmp/nvmemp.XXXXXX)
export MILLRACE_HOME=$work/home MILLRACE_LOG=${MILLRACE_LOG:-info}
t0=$(date +%s)
step() { echo "nvme-multipath: [$(( $(date +%s) - t0 ))s] $*"; }
fail() {
  echo "nvme-multipath: FAILED: $*"
  echo "--- server log (tail) ---"; tail -40 "$work/server.log" 2>/dev/null || true
  echo "--- kernel log (tail) ---"; dmesg | grep -iE 'nvme' | tail -30 || true
  echo "--- nvme list-subsys ---"; nvme list-subsys 2>&1 | head -20 || true
  exit 1
}
cleanup() {
  [[ -n ${fpid:-} ]] && kill "$fpid" 2>/dev/null || true
  nvme disconnect-all >/dev/null 2>&1 || true
  [[ -n ${spid:-} ]] && kill "$spid" 2>/dev/null || true
}
trap cleanup EXIT

modprobe nvme-tcp || fail "cannot load nvme-tcp"
[[ $(cat /sys/module/nvme_core/parameters/multipath) == Y ]] \
  || fail "the guest kernel's native NVMe multipath is off (nvme_core.multipath=N); this test needs it"

# The disks the runner attached (this script's `# run-in-guest:` line), in order.
read -ra drives <<< "${RUN_IN_GUEST_DISKS:-}"
((${#drives[@]} == 3)) || fail "expected the runner's 3 virtio disks, RUN_IN_GUEST_DISKS is '${RUN_IN_GUEST_DISKS:-}'"
"$MR" pool create tank --level raid5 --strip 64k "${drives[@]}" > "$work/pool.out" 2>&1 \
  || { cat "$work/pool.out"; fail "millrace pool create"; }
"$MR" volume create tank/mp --size 64M > /dev/null || fail "millrace volume create"
"$MR" serve --nvme "$A" --nvme "$B" >> "$work/server.log" 2>&1 &
spid=$!
for _ in $(seq 150); do
  [[ -s $MILLRACE_HOME/server.json ]] && (exec 3<>/dev/tcp/127.0.0.1/4421) 2>/dev/null && break
  kill -0 "$spid" 2>/dev/null || fail "millrace serve exited"
  sleep 0.3
done
"$MR" export nvme add tank/mp --host "$HOST" > "$work/export.out" 2>&1 \
  || { cat "$work/export.out"; fail "millrace export nvme add"; }
step "millrace serve on $A and $B, tank/mp exported as $NQN"

common=(-t tcp -a 127.0.0.1 --hostnqn "$HOST" --hostid "$HOSTID")
nvme discover "${common[@]}" -s 8009 > "$work/disc" 2>&1 || { cat "$work/disc"; fail "nvme discover"; }
for p in 4420 4421; do
  grep -q "trsvcid: *$p" "$work/disc" || { cat "$work/disc"; fail "discovery does not list the listener on port $p"; }
done
[[ $(grep -c "subnqn: *$NQN" "$work/disc") == 2 ]] || { cat "$work/disc"; fail "discovery does not list $NQN once per listener"; }
step "discovery lists both paths"

connect() { # PORT
  nvme connect "${common[@]}" -s "$1" -n "$NQN" -i 2 > "$work/connect.out" 2>&1 \
    || { cat "$work/connect.out"; fail "nvme connect to port $1"; }
}
# The controller (nvmeN) connected to port $1, and its path node's ana_state file.
ctrl_of() {
  local c
  for c in /sys/class/nvme/nvme*; do
    [[ $(cat "$c/subsysnqn" 2>/dev/null) == "$NQN" ]] || continue
    grep -q "trsvcid=$1" "$c/address" 2>/dev/null && { basename "$c"; return 0; }
  done
  return 1
}
ana_file() { ls /sys/class/nvme/"$(ctrl_of "$1")"/nvme*c*n1/ana_state 2>/dev/null | head -1; }
wait_ana() { # PORT STATE
  local f
  for _ in $(seq 100); do
    f=$(ana_file "$1" || true)
    [[ -n $f && $(cat "$f" 2>/dev/null) == "$2" ]] && return 0
    sleep 0.1
  done
  fail "the kernel's path through port $1 is '$(cat "$f" 2>/dev/null)', not '$2', 10 s after the change"
}
connect 4420
connect 4421
for _ in $(seq 50); do ctrl_of 4420 >/dev/null && ctrl_of 4421 >/dev/null && break; sleep 0.2; done
ca=$(ctrl_of 4420) || fail "no controller connected through port 4420"
cb=$(ctrl_of 4421) || fail "no controller connected through port 4421"
ns=
for _ in $(seq 50); do
  ns=$(ls -d /sys/block/nvme*n1 2>/dev/null | grep -v 'c[0-9]*n1$' | head -1 || true)
  [[ -n $ns && -b /dev/$(basename "$ns") ]] && break
  sleep 0.2
done
[[ -n $ns ]] || fail "no multipath block device appeared"
ns=/dev/$(basename "$ns")
[[ $(ls -d /sys/block/nvme*n1 | grep -vc 'c[0-9]*n1$') == 1 ]] || fail "the kernel made more than one block device: the two paths were not joined"
nvme list-subsys > "$work/subsys" 2>&1 || { cat "$work/subsys"; fail "nvme list-subsys"; }
[[ $(grep -cE 'trsvcid=442[01].* live' "$work/subsys") == 2 ]] || { cat "$work/subsys"; fail "nvme list-subsys does not show two live paths"; }
wait_ana 4420 optimized
wait_ana 4421 optimized
subsys=
for s in /sys/class/nvme-subsystem/nvme-subsys*; do
  [[ $(cat "$s/subsysnqn" 2>/dev/null) == "$NQN" ]] && subsys=$s
done
[[ -n $subsys ]] || fail "no nvme-subsystem in sysfs for $NQN"
# Round-robin sends I/O down both optimized paths, so both carry fio's writes below.
echo round-robin > "$subsys/iopolicy" || fail "cannot set iopolicy round-robin"
step "$ns over $ca (4420) and $cb (4421), both optimized; iopolicy $(cat "$subsys/iopolicy")"

"$MR" export list > "$work/list" || fail "millrace export list"
for p in "$A" "$B"; do
  grep -q "path tcp $p optimized (ANA group 1)" "$work/list" || { cat "$work/list"; fail "export list does not show the path $p as optimized"; }
done
"$MR" export nvme ana set tank/mp --listener 127.0.0.1:9999 --state inaccessible > "$work/bad.out" 2>&1 \
  && fail "an ANA state for a listener that does not exist was accepted"
grep -q "no tcp listener on 127.0.0.1:9999" "$work/bad.out" || { cat "$work/bad.out"; fail "the refusal does not say which listener is unknown"; }
step "export list shows both paths; a state for an unknown listener is refused"

ana_set() { "$MR" export nvme ana set tank/mp --listener "$1" --state "$2" > "$work/ana.out" 2>&1 || { cat "$work/ana.out"; fail "ana set $1 $2"; }; }
# fio writes 4k-128k blocks with crc32c headers at random offsets of the first 32 MiB, paced at
# 384 KB/s (about 85 s) so the path changes happen under it, then reads them back and checks them.
# The pace leaves room for a loaded CI machine: there, under emulation beside another guest and
# the host's suites, the host took 20 s to see one ANA change, and fio paced at 1 MB/s (32 s)
# ended before the last path change.
fiojob=(--name=mp --filename="$ns" --direct=1 --ioengine=libaio --iodepth=16 --rw=randwrite
  --bsrange=4k-128k --size=32M --verify=crc32c --verify_fatal=1 --randrepeat=1 --randseed=49)
fio_ok() {
  grep -q "err= 0" "$1" && ! grep -qiE 'verify.*(fail|bad)|crc32c: verify' "$1" \
    && grep -qE 'READ: .*io=32\.0MiB' "$1" && { [[ ${2:-} == read ]] || grep -qE 'WRITE: .*io=32\.0MiB' "$1"; }
}
timeout 600 fio "${fiojob[@]}" --do_verify=1 --rate=,384k --output="$work/fio1.out" > /dev/null 2>&1 &
fpid=$!
sleep 3
ana_set "$A" inaccessible
wait_ana 4420 inaccessible
sleep 4
kill -0 "$fpid" 2>/dev/null || fail "fio ended before the path came back; the test proved nothing"
ana_set "$A" optimized
wait_ana 4420 optimized
step "(a) path 4420 inaccessible for 4 s under fio, then optimized again"
ana_set "$B" non-optimized
wait_ana 4421 non-optimized
sleep 2
ana_set "$B" optimized
wait_ana 4421 optimized
step "    path 4421 non-optimized for 2 s, then optimized"
nvme disconnect -d "$ca" > /dev/null || fail "nvme disconnect -d $ca"
sleep 4
kill -0 "$fpid" 2>/dev/null || fail "fio ended before the path was reconnected; the test proved nothing"
connect 4420
for _ in $(seq 50); do ctrl_of 4420 >/dev/null && break; sleep 0.2; done
ca=$(ctrl_of 4420) || fail "the path through 4420 did not come back"
wait_ana 4420 optimized
step "(b) path 4420 disconnected for 4 s under fio, connected again as $ca"
wait "$fpid" || { tail -20 "$work/fio1.out"; fail "fio with verify across the path changes exited with an error"; }
fpid=
fio_ok "$work/fio1.out" || { tail -20 "$work/fio1.out"; fail "fio reported errors across the path changes"; }
dmesg | grep -iE "nvme.*(I/O error|critical|blk_update_request)" && fail "the kernel logged I/O errors"
# Writes completed on each path (field 5 of a block device's stat: writes completed).
for c in "$ca" "$cb"; do
  w=$(awk '{print $5}' /sys/class/nvme/"$c"/nvme*c*n1/stat 2>/dev/null | head -1)
  (( ${w:-0} > 0 )) || fail "no write went through $c: round-robin did not use both paths"
done
step "fio randwrite 4k-128k + crc32c verify ok across both"

ana_set "$B" inaccessible
wait_ana 4421 inaccessible
timeout 300 fio "${fiojob[@]}" --verify_only --output="$work/fio2.out" > /dev/null 2>&1 \
  || { tail -20 "$work/fio2.out"; fail "fio read-verify with path 4421 inaccessible"; }
fio_ok "$work/fio2.out" read || { tail -20 "$work/fio2.out"; fail "fio read-verify with path 4421 inaccessible reported errors"; }
api=$(sed -n 's/^ *"url": *"\(.*\)",\?$/\1/p' "$MILLRACE_HOME/server.json")
if command -v curl > /dev/null; then
  curl -s "$api/metrics" > "$work/metrics" || fail "GET /metrics"
  grep -qE "millrace_nvme_ana_state\{.*listener=\"$B\".*state=\"inaccessible\".*\} 1" "$work/metrics" \
    || { grep ana "$work/metrics"; fail "/metrics does not show path $B inaccessible"; }
fi
ana_set "$B" optimized
wait_ana 4421 optimized
step "read-verify ok through 4420 alone; /metrics shows the state"

size=$((96 << 20))
"$MR" volume grow tank/mp --size 96M > /dev/null || fail "millrace volume grow"
got=0
for _ in $(seq 50); do
  got=$(blockdev --getsize64 "$ns")
  [[ $got == "$size" ]] && break
  sleep 0.2
done
[[ $got == "$size" ]] || fail "the connected host sees $got bytes 10 s after the volume grew to $size"
step "volume grown to 96 MiB: $ns shows it without reconnecting"
timeout 300 fio "${fiojob[@]}" --verify_only --output="$work/fio3.out" > /dev/null 2>&1 \
  || { tail -20 "$work/fio3.out"; fail "fio read-verify after the grow"; }
step "PASS"
