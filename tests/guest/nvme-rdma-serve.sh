#!/usr/bin/env bash
# run-in-guest: --disk 64M --disk 64M --disk 64M --disk 64M
# Runs inside the guest (tests/guest/run-in-guest). Proves `millrace serve --nvme-rdma` (Millrace's
# own user-space NVMe/RDMA target, crates/millrace-nvmf-rdma over the target's sessions) against
# the stock Linux initiator on soft-RoCE: a RAID5 pool on four virtio disks, a volume exported to
# one host NQN; `nvme discover -t rdma` lists the subsystem once per transport (RDMA and TCP);
# `nvme connect -t rdma` gives the namespace with several I/O queues; status and the API count
# the host under RDMA; fio with crc32c verify (random 4K-256K, two jobs) while a drive is failed
# with `millrace pool fail`, invisible to the host; disconnect, reconnect, data intact; controller
# resets under fio; hang-ups (#46): `examples/rdma_hangups` plays 48 misbehaving controllers
# (32 MiB of writes whose data cannot be read, reads whose responses find no receive, queue pairs
# that never Connect, disconnects with I/O in flight, processes killed with SIGKILL) while a good
# controller's 4 KiB writes and reads are each answered and verified (within 3 s while the 48
# hold their transfers, 10 s while queue pairs are set up or torn down: the emulated guest is for
# correctness, not timing, and its soft-RoCE burns the same CPUs; the slowest round of each
# phase is printed), and the target
# closes every stalled queue by its deadlines; then the stock host's fio is killed with SIGKILL
# and a controller disconnected under load while another fio verifies; every time /metrics goes
# back to idle (no NVMe/RDMA queue, no buffer in use), abandoned requests and timeouts are
# counted, and closures are logged at most once a second; a host that is not allowed is refused
# as over TCP. No soft-RoCE, nvme-rdma or rdma_hangups is a failure, never a pass.
#   usage (on the host): cargo build --workspace --bins
#          tests/guest/run-in-guest --timeout 1200 tests/guest/nvme-rdma-serve.sh $PWD/target/debug
set -euo pipefail
DIR=$(realpath "${1:-$PWD/target/debug}")
MR=$DIR/millrace
[[ -x $MR ]] || { echo "nvme-rdma-serve: millrace is missing under $DIR; build it first (cargo build -p millrace-cli -p millrace-server)"; exit 1; }
# shellcheck source=../lib/soft-roce.sh
source "$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../lib/soft-roce.sh"
# shellcheck source=../lib/nvme-host.sh
source "$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../lib/nvme-host.sh"
HOST=nqn.2014-08.org.nvmexpress:uuid:4d696c6c-7261-6365-0000-000000000001
HOSTID=4d696c6c-7261-6365-0000-000000000001
BADHOST=nqn.2014-08.org.nvmexpress:uuid:4d696c6c-7261-6365-0000-0000000000ff
BADHOSTID=4d696c6c-7261-6365-0000-0000000000ff
NQN=nqn.2026-11.dev.millrace:tank.scratch
work=$(mktemp -d /tmp/nvmerdmaserve.XXXXXX)
export MILLRACE_HOME=$work/home MILLRACE_LOG=${MILLRACE_LOG:-info}
# The hang-up test's 48 stalled hosts hold buffers: with the guests' 32 MiB pool (run-in-guest)
# one stalled queue stayed open past its 300 s deadline (the closure waited on buffers the other
# stalled queues held; found in CI at 549cdb5, not yet fixed in the target), so the server here
# keeps the default 256 MiB this test was written against.
export MILLRACE_BUFFER_POOL=256M
t0=$(date +%s)
step() { echo "nvme-rdma-serve: [$(( $(date +%s) - t0 ))s] $*"; }
fail() {
  echo "nvme-rdma-serve: FAILED: $*"
  echo "--- server log (tail) ---"; tail -40 "$work/server.log" 2>/dev/null || true
  echo "--- kernel log (tail) ---"; dmesg | grep -iE 'nvme|rdma|rxe' | tail -30 || true
  exit 1
}
cleanup() {
  [[ -n ${fpid:-} ]] && kill "$fpid" 2>/dev/null || true
  nvme disconnect-all > /dev/null 2>&1 || true
  [[ -n ${spid:-} ]] && kill "$spid" 2>/dev/null || true
}
trap cleanup EXIT

# No soft-RoCE is a failure, not a skip: setup.sh installs what it needs and the guest's kernel
# has rdma_rxe, so a missing piece means NVMe/RDMA would go untested.
soft_roce_up || fail "$SOFT_ROCE_WHY, so NVMe/RDMA cannot be tested here"
modprobe nvme-rdma || fail "this kernel lacks nvme-rdma"
step "soft-RoCE up ($RDMA_DEV on mr0, $RDMA_ADDR), nvme-rdma loaded"

# The pool's drives: the runner's virtio disks (this script's `# run-in-guest:` line).
read -ra drives <<< "${RUN_IN_GUEST_DISKS:-}"
((${#drives[@]} == 4)) || fail "expected the runner's 4 virtio disks, RUN_IN_GUEST_DISKS is '${RUN_IN_GUEST_DISKS:-}'"
"$MR" pool create tank --level raid5 --strip 64k "${drives[@]}" > "$work/pool.out" 2>&1 \
  || { cat "$work/pool.out"; fail "millrace pool create on ${drives[*]}"; }
"$MR" volume create tank/scratch --size 96M > /dev/null || fail "millrace volume create"
step "pool tank (raid5, 4 drives), volume tank/scratch"

"$MR" serve --nvme-rdma "$RDMA_ADDR" >> "$work/server.log" 2>&1 &
spid=$!
for _ in $(seq 150); do
  grep -q "NVMe/RDMA on $RDMA_ADDR:4420" "$work/server.log" && break
  kill -0 "$spid" 2>/dev/null || fail "millrace serve exited"
  sleep 0.3
done
grep -q "NVMe/RDMA on $RDMA_ADDR:4420" "$work/server.log" || fail "millrace serve does not say it serves NVMe/RDMA on $RDMA_ADDR:4420"
"$MR" export nvme add tank/scratch --host "$HOST" > "$work/export.out" 2>&1 \
  || { cat "$work/export.out"; fail "millrace export nvme add"; }
step "millrace serve --nvme-rdma $RDMA_ADDR up; tank/scratch exported to $HOST only"

common=(-t rdma -a "$RDMA_ADDR" -s 4420 --hostnqn "$HOST" --hostid "$HOSTID")
nvme discover "${common[@]}" > "$work/disc" 2>&1 || { cat "$work/disc"; fail "nvme discover -t rdma"; }
[[ $(grep -c "subnqn: *$NQN" "$work/disc") == 2 ]] || { cat "$work/disc"; fail "discovery over RDMA should list $NQN once per transport (tcp, rdma)"; }
grep -q "trtype: *rdma" "$work/disc" || { cat "$work/disc"; fail "discovery lists no rdma entry"; }
grep -q "trtype: *tcp" "$work/disc" || { cat "$work/disc"; fail "discovery lists no tcp entry"; }
# A stranger's discovery succeeds and lists nothing; its Connect is refused further down.
nvme discover -t rdma -a "$RDMA_ADDR" -s 4420 --hostnqn "$BADHOST" --hostid "$BADHOSTID" > "$work/discbad" 2>&1 \
  || { cat "$work/discbad"; fail "discovery over RDMA failed for a host that is not allowed (it should succeed and list nothing)"; }
grep -q "Number of Records 0," "$work/discbad" || { cat "$work/discbad"; fail "discovery over RDMA does not give an empty log to a host that is not allowed"; }
grep -q "subnqn" "$work/discbad" && { cat "$work/discbad"; fail "discovery over RDMA lists entries to a host that is not allowed"; }
step "nvme discover -t rdma: $NQN listed once over rdma and once over tcp; hidden from a stranger"

# The value of metric line $1 (its name and labels as /metrics writes them), or nothing.
# awk reads to the end: leaving early fails curl's write (status 23), and with it the script.
metric() { { curl -s "$api/metrics" || true; } | awk -v k="$1" 'index($0, k " ") == 1 && !n++ { print $2 }'; }
# Waits (up to 30 s) until no NVMe/RDMA queue is open and no pool buffer is in use.
idle() {
  local open in_use
  for _ in $(seq 100); do
    open=$(metric 'millrace_export_connections{protocol="nvme-rdma"}')
    in_use=$(metric 'millrace_buffer_pool_bytes{state="in_use"}')
    [[ $open == 0 && $in_use == 0 ]] && return 0
    sleep 0.3
  done
  fail "$1: $open NVMe/RDMA queues are still open and $in_use buffer bytes in use"
}
# The namespace (/dev/nvmeXnY) of the connected subsystem $1, with native multipath or without.
ns_of() {
  local s c
  for _ in $(seq 100); do
    for s in /sys/class/nvme-subsystem/nvme-subsys* /sys/class/nvme/nvme*; do
      [[ -e $s/subsysnqn && $(cat "$s/subsysnqn") == "$1" ]] || continue
      for c in "$s"/nvme*n1; do
        [[ -b /dev/$(basename "$c") ]] && { echo "/dev/$(basename "$c")"; return 0; }
      done
    done
    sleep 0.2
  done
  return 1
}

connect() {
  nvme connect "${common[@]}" -n "$NQN" -i 2 > "$work/connect.out" 2>&1 \
    || { cat "$work/connect.out"; fail "nvme connect -t rdma"; }
  find_ns || fail "no namespace appeared after nvme connect -t rdma"
}
disconnect() {
  nvme disconnect -n "$NQN" > /dev/null || fail "nvme disconnect"
  for _ in $(seq 50); do [[ -z $(ls /sys/block | grep '^nvme' || true) ]] && break; sleep 0.2; done
}
# Hang-ups (#46). Misbehaving hosts of our own (examples/rdma_hangups, a minimal NVMe/RDMA host):
# 48 controllers hold 32 MiB of writes the target cannot read, 32 MiB of reads whose responses
# find no receive, queue pairs that never Connect, or disconnect with 32 MiB in flight; 4
# processes with I/O in flight are killed with SIGKILL. A good controller's 4 KiB writes and
# reads must each be answered (see the header for the bounds) and read back byte for byte
# throughout, and the target
# must close every stalled queue by itself (handshake 10 s, transfer 10 s, reply 30 s). Then the
# stock host: fio killed with SIGKILL, and a controller disconnected under load, while another
# controller's fio verifies. After each, /metrics is back to idle.
hangups() {
  local hang=$DIR/examples/rdma_hangups t_h secs closes n
  [[ -x $hang ]] || fail "rdma_hangups is missing under $DIR/examples; build it first (cargo build --workspace --bins --examples)"
  api=$(sed -n 's/^ *"url": *"\(.*\)",\?$/\1/p' "$MILLRACE_HOME/server.json")
  [[ -n $api ]] || fail "no API url in $MILLRACE_HOME/server.json"
  idle "before the hang-ups"
  t_h=$(date +%s)
  timeout 900 "$hang" "$RDMA_ADDR:4420" "$NQN" "$HOST" --stalled 48 --max-ms 3000 --churn-max-ms 10000 --deadline-s 300 > "$work/hang.out" 2>&1 \
    || { cat "$work/hang.out"; fail "misbehaving NVMe/RDMA hosts disturbed the good one, or the target kept what they held"; }
  grep -q 'rdma_hangups: PASS' "$work/hang.out" || { cat "$work/hang.out"; fail "rdma_hangups did not say PASS"; }
  kill -0 "$spid" 2>/dev/null || fail "the server died under misbehaving NVMe/RDMA hosts"
  idle "after the misbehaving hosts left"
  n=$(metric 'millrace_export_requests_abandoned_total{protocol="nvme-rdma"}')
  [[ ${n:-0} =~ ^[0-9]+$ && $n -gt 0 ]] || fail "no NVMe/RDMA request abandoned by a host that hung up was counted ('$n')"
  n=$(metric 'millrace_export_connections_timed_out_total{protocol="nvme-rdma"}')
  [[ ${n:-0} =~ ^[0-9]+$ && $n -gt 0 ]] || fail "no NVMe/RDMA queue closed for a missed deadline was counted ('$n')"
  secs=$(( $(date +%s) - t_h + 1 ))
  closes=$(grep -cE 'NVMe/RDMA queue closed \(|closing an NVMe/RDMA queue whose host' "$work/server.log" || true)
  (( closes >= 1 && closes <= secs )) || fail "$closes log lines about closed NVMe/RDMA queues in $secs s (at least one, at most one a second)"
  step "$(grep -E '^rdma_hangups: PASS' "$work/hang.out" | sed 's/^rdma_hangups: //'); $closes closure lines in $secs s; metrics idle"

  # The stock host: a second volume on its own controller takes the abuse.
  local NQN2=nqn.2026-11.dev.millrace:tank.other ns1 ns2 fa fb fc
  "$MR" volume create tank/other --size 32M > /dev/null || fail "millrace volume create tank/other"
  "$MR" export nvme add tank/other --host "$HOST" > /dev/null || fail "millrace export nvme add tank/other"
  nvme connect "${common[@]}" -n "$NQN" -i 2 > /dev/null 2>&1 || fail "nvme connect -t rdma $NQN"
  nvme connect "${common[@]}" -n "$NQN2" -i 2 > /dev/null 2>&1 || fail "nvme connect -t rdma $NQN2"
  ns1=$(ns_of "$NQN") || fail "no namespace for $NQN"
  ns2=$(ns_of "$NQN2") || fail "no namespace for $NQN2"
  timeout 600 fio "${fiojob[@]}" --filename="$ns1" --numjobs=1 --do_verify=1 --rate=,1m --output="$work/fio4.out" > /dev/null 2>&1 &
  fa=$!
  fpid=$fa
  load=(--name=load --direct=1 --ioengine=libaio --iodepth=16 --rw=randrw --bs=128k --size=32M --time_based --runtime=120)
  fio "${load[@]}" --filename="$ns2" --output="$work/fio5.out" > /dev/null 2>&1 &
  fb=$!
  sleep 3
  kill -0 "$fb" 2>/dev/null || { cat "$work/fio5.out"; fail "the load on $NQN2 ended before it could be killed"; }
  kill -9 "$fb"; wait "$fb" 2>/dev/null || true
  fio "${load[@]}" --filename="$ns2" --output="$work/fio6.out" > /dev/null 2>&1 &
  fc=$!
  sleep 3
  kill -0 "$fc" 2>/dev/null || { cat "$work/fio6.out"; fail "the load on $NQN2 ended before its controller could be disconnected"; }
  nvme disconnect -n "$NQN2" > /dev/null || fail "nvme disconnect -n $NQN2 under load"
  wait "$fc" 2>/dev/null || true
  kill -0 "$fa" 2>/dev/null || { tail -20 "$work/fio4.out"; fail "the verifying fio ended before the hang-ups were over; they proved nothing"; }
  wait "$fa" || { tail -20 "$work/fio4.out"; fail "fio verify on $NQN while another controller was killed and disconnected under load"; }
  fpid=
  fio_ok "$work/fio4.out" || { tail -20 "$work/fio4.out"; fail "fio verify reported errors while another controller hung up"; }
  kill -0 "$spid" 2>/dev/null || fail "the server died when a host hung up under load"
  nvme disconnect -n "$NQN" > /dev/null || fail "nvme disconnect -n $NQN"
  idle "after the stock host hung up"
  step "stock host: fio killed with SIGKILL and $NQN2 disconnected under load; fio on $NQN verified; metrics idle"
}

connect
[[ $(cat "/sys/class/nvme/$ctrl/transport") == rdma ]] || fail "$ctrl is not an RDMA controller"
queues=$(cat "/sys/class/nvme/$ctrl/queue_count")
(( queues >= 3 )) || fail "expected an admin and at least 2 I/O queues, got $queues"
nvme id-ctrl "/dev/$ctrl" > "$work/idctrl" || fail "nvme id-ctrl"
grep -qE '^mn +: Millrace' "$work/idctrl" || { head -20 "$work/idctrl"; fail "id-ctrl does not name Millrace"; }
"$MR" status > "$work/status.out" 2>&1 || { cat "$work/status.out"; fail "millrace status"; }
grep -q "rdma $RDMA_ADDR:4420" "$work/status.out" || { cat "$work/status.out"; fail "status does not list the NVMe/RDMA listener"; }
grep -q "1 over RDMA" "$work/status.out" || { cat "$work/status.out"; fail "status does not count the host under RDMA"; }
grep -q '"transport": "rdma"' <("$MR" export list --json) || fail "export list does not show the host's transport as rdma"
# Every queue runs on a core of the data path (its device calls the *_async ones there).
n_acc=$(grep -c 'NVMe/RDMA queue accepted' "$work/server.log" || true)
n_core=$(grep 'NVMe/RDMA queue accepted' "$work/server.log" | grep -cE 'core=Some\([0-9]+\)' || true)
[[ $n_acc -gt 0 && $n_acc == "$n_core" ]] || { grep 'queue accepted' "$work/server.log" | tail -5; fail "NVMe/RDMA queues run off the data path's cores ($n_core of $n_acc on a core)"; }
step "connected over RDMA: $ctrl ($ns), $queues queues; status and exports show it under rdma; its $n_acc queues on the cores"

# Two jobs, each on its own 16 MiB, random 4K-256K writes with crc32c headers, read back and
# checked; paced so a drive fails while they are in flight.
fiojob=(--name=verify --filename="$ns" --direct=1 --ioengine=libaio --iodepth=8 --numjobs=2
  --size=16M --offset_increment=16M --rw=randwrite --bsrange=4k-256k --verify=crc32c
  --verify_fatal=1 --randrepeat=1 --randseed=18 --group_reporting)
fio_ok() { grep -q "err= 0" "$1" && ! grep -qiE 'verify.*(fail|bad)|crc32c: verify' "$1"; }
timeout 900 fio "${fiojob[@]}" --do_verify=1 --rate=,1m --output="$work/fio1.out" > /dev/null 2>&1 &
fpid=$!
sleep 4
kill -0 "$fpid" 2>/dev/null || { cat "$work/fio1.out"; fail "fio ended before a drive could be failed under it"; }
"$MR" pool fail tank "${drives[1]}" > "$work/fail.out" 2>&1 || { cat "$work/fail.out"; fail "millrace pool fail"; }
kill -0 "$fpid" 2>/dev/null || fail "fio ended before the drive failure took effect; the test proved nothing"
step "failed ${drives[1]} while fio writes over RDMA"
wait "$fpid" || { tail -20 "$work/fio1.out"; fail "fio verify over RDMA across a drive failure"; }
fpid=
fio_ok "$work/fio1.out" || { tail -20 "$work/fio1.out"; fail "fio reported errors"; }
grep -q '^  "state": "degraded"' <("$MR" pool show tank --json) || fail "the pool is not degraded after a drive failed"
dd if="$ns" bs=1M count=32 iflag=direct status=none | sha256sum > "$work/sum1"
disconnect
step "fio 4k-256k random writes verified (crc32c, 2 jobs) across a drive failure; disconnected"

connect
timeout 600 fio "${fiojob[@]}" --verify_only --output="$work/fio2.out" > /dev/null 2>&1 \
  || { tail -20 "$work/fio2.out"; fail "fio verify after reconnect"; }
fio_ok "$work/fio2.out" || { tail -20 "$work/fio2.out"; fail "fio verify after reconnect reported errors"; }
dd if="$ns" bs=1M count=32 iflag=direct status=none | sha256sum | cmp -s - "$work/sum1" \
  || fail "the data differs after reconnecting"
disconnect
step "reconnected over RDMA: data intact"

# The host resets its controller twice under fio: each time every RDMA queue pair is torn down
# with I/O in flight, as a host that goes away mid-request does, and the host reconnects. The
# server keeps serving; fio's verified writes see no error.
connect
timeout 900 fio "${fiojob[@]}" --filename="$ns" --do_verify=1 --rate=,1m --output="$work/fio3.out" > /dev/null 2>&1 &
fpid=$!
for i in 1 2; do
  sleep 4
  kill -0 "$fpid" 2>/dev/null || { cat "$work/fio3.out"; fail "fio ended before controller reset $i"; }
  nvme reset "/dev/$ctrl" || fail "nvme reset /dev/$ctrl over RDMA"
done
wait "$fpid" || { tail -20 "$work/fio3.out"; fail "fio verify over RDMA across controller resets"; }
fpid=
fio_ok "$work/fio3.out" || { tail -20 "$work/fio3.out"; fail "fio reported errors across controller resets"; }
kill -0 "$spid" || fail "the server died when the host reset its queues"
disconnect
step "two controller resets under fio over RDMA: the host reconnected, verify ok, the server up"

hangups

if nvme connect -t rdma -a "$RDMA_ADDR" -s 4420 -n "$NQN" --hostnqn "$BADHOST" --hostid "$BADHOSTID" > "$work/bad.out" 2>&1; then
  fail "a host that is not allowed connected over RDMA"
fi
ls /sys/block | grep '^nvme' > /dev/null && fail "a namespace appeared for a host that is not allowed"
grep "refused a Connect: the host is not allowed" "$work/server.log" | grep -q "$BADHOST" \
  || fail "the server did not refuse $BADHOST at Connect (its log says nothing of it)"
kill -0 "$spid" || fail "the server died"
step "a host not allowed is refused over RDMA"
kill -TERM "$spid"; wait "$spid" || fail "the server exited with status $? on SIGTERM"
spid=
step "PASS"
