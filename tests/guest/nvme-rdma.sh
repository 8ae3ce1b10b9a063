#!/usr/bin/env bash
# Runs inside the guest (tests/guest/run-in-guest). NVMe over RDMA on soft-RoCE with the stock
# Linux initiator: the recipe (rping over rxe) and a short baseline against the kernel's own
# nvmet-rdma target (discover, connect, data written and read back across a reconnect, a host not
# allowed refused), so a failure of tests/guest/nvme-rdma-serve.sh (Millrace's own target, which
# runs fio with verify, a drive failure and the rest) can be told apart from a broken soft-RoCE
# or host. Then Millrace's transport alone (its rdma_refuse example): the Connect data fetched by
# RDMA READ of the host's keyed SGL and the refusal sent by SEND with invalidate, which the host
# reports as "not allowed". Where soft-RoCE cannot be set up (no rdma_rxe, no `rdma` tool), it
# fails saying what is missing.
#   usage (on the host): tests/guest/run-in-guest --timeout 900 tests/guest/nvme-rdma.sh [target/debug]
set -euo pipefail
DIR=$(realpath "${1:-$PWD/target/debug}")
PROBE=$DIR/examples/rdma_refuse
[[ -x $PROBE ]] || { echo "nvme-rdma: $PROBE is missing; build it first (cargo build -p millrace-nvmf-rdma --examples)"; exit 1; }
# shellcheck source=../lib/soft-roce.sh
source "$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../lib/soft-roce.sh"
# shellcheck source=../lib/nvme-host.sh
source "$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../lib/nvme-host.sh"
HOST=nqn.2014-08.org.nvmexpress:uuid:4d696c6c-7261-6365-0000-000000000001
HOSTID=4d696c6c-7261-6365-0000-000000000001
BADHOST=nqn.2014-08.org.nvmexpress:uuid:4d696c6c-7261-6365-0000-0000000000ff
BADHOSTID=4d696c6c-7261-6365-0000-0000000000ff
NQN=nqn.2026-11.dev.millrace:rdma.baseline
work=$(mktemp -d /tmp/nvmerdma.XXXXXX)
cfg=/sys/kernel/config/nvmet
t0=$(date +%s)
step() { echo "nvme-rdma: [$(( $(date +%s) - t0 ))s] $*"; }
fail() {
  echo "nvme-rdma: FAILED: $*"
  echo "--- kernel log (tail) ---"; dmesg | grep -iE 'nvme|rdma|rxe' | tail -30 || true
  exit 1
}
cleanup() {
  nvme disconnect-all > /dev/null 2>&1 || true
  [[ -n ${ppid_:-} ]] && kill "$ppid_" 2>/dev/null || true
  rm -f "$cfg"/ports/1/subsystems/* 2>/dev/null || true
}
trap cleanup EXIT

# No soft-RoCE is a failure, not a skip: setup.sh installs what it needs and the guest's kernel
# has rdma_rxe, so a missing piece means NVMe/RDMA would go untested.
soft_roce_up || fail "$SOFT_ROCE_WHY, so NVMe/RDMA cannot be tested here"
soft_roce_prove || fail "rping over $RDMA_DEV failed: the soft-RoCE recipe does not work here"
modprobe -a nvmet-rdma nvme-rdma loop || fail "this kernel lacks nvmet-rdma or nvme-rdma"
mountpoint -q /sys/kernel/config || mount -t configfs none /sys/kernel/config
step "soft-RoCE up ($RDMA_DEV on mr0, $RDMA_ADDR), rping passes, nvme-rdma and nvmet-rdma loaded"

# The kernel's target: one subsystem, one namespace on a 256 MiB file, only $HOST allowed.
truncate -s 256M "$work/ns.img"
dev=$(losetup -f --show "$work/ns.img")
mkdir "$cfg/subsystems/$NQN"
echo 0 > "$cfg/subsystems/$NQN/attr_allow_any_host"
mkdir "$cfg/hosts/$HOST"
ln -s "$cfg/hosts/$HOST" "$cfg/subsystems/$NQN/allowed_hosts/$HOST"
mkdir "$cfg/subsystems/$NQN/namespaces/1"
echo "$dev" > "$cfg/subsystems/$NQN/namespaces/1/device_path"
echo 1 > "$cfg/subsystems/$NQN/namespaces/1/enable"
mkdir "$cfg/ports/1"
echo rdma > "$cfg/ports/1/addr_trtype"; echo ipv4 > "$cfg/ports/1/addr_adrfam"
echo "$RDMA_ADDR" > "$cfg/ports/1/addr_traddr"; echo 4420 > "$cfg/ports/1/addr_trsvcid"
ln -s "$cfg/subsystems/$NQN" "$cfg/ports/1/subsystems/$NQN"
step "nvmet-rdma serves $NQN on $RDMA_ADDR:4420 to $HOST only"

common=(-t rdma -a "$RDMA_ADDR" -s 4420 --hostnqn "$HOST" --hostid "$HOSTID")
nvme discover "${common[@]}" > "$work/disc" 2>&1 || { cat "$work/disc"; fail "nvme discover -t rdma"; }
grep "subnqn: *$NQN" "$work/disc" > /dev/null || { cat "$work/disc"; fail "discovery does not list $NQN"; }
grep "trtype: *rdma" "$work/disc" > /dev/null || fail "discovery does not say rdma"
step "nvme discover -t rdma lists $NQN"

connect() {
  nvme connect "${common[@]}" -n "$NQN" -i 2 > "$work/connect.out" 2>&1 || { cat "$work/connect.out"; fail "nvme connect -t rdma"; }
  find_ns || fail "no namespace appeared after nvme connect -t rdma"
}
connect
[[ $(cat "/sys/class/nvme/$ctrl/transport") == rdma ]] || fail "$ctrl is not an RDMA controller"
queues=$(cat "/sys/class/nvme/$ctrl/queue_count")
(( queues >= 3 )) || fail "expected an admin and at least 2 I/O queues, got $queues"
step "connected over RDMA: $ctrl ($ns), $queues queues"

head -c $((16 << 20)) /dev/urandom > "$work/data"
dd if="$work/data" of="$ns" bs=256k oflag=direct status=none || fail "writing 16 MiB over RDMA"
cmp <(dd if="$ns" bs=1M count=16 iflag=direct status=none) "$work/data" || fail "16 MiB read back differ"
nvme disconnect -n "$NQN" > /dev/null || fail "nvme disconnect"
step "16 MiB written and read back over RDMA; disconnected"

connect
cmp <(dd if="$ns" bs=1M count=16 iflag=direct status=none) "$work/data" \
  || fail "the data differs after reconnecting"
nvme disconnect -n "$NQN" > /dev/null || fail "nvme disconnect"
step "reconnected: data intact"

if nvme connect -t rdma -a "$RDMA_ADDR" -s 4420 -n "$NQN" --hostnqn "$BADHOST" --hostid "$BADHOSTID" > "$work/bad.out" 2>&1; then
  fail "a host that is not allowed connected"
fi
ls /sys/block | grep '^nvme' > /dev/null && fail "a namespace appeared for a host that is not allowed"
step "a host not allowed is refused"
losetup -d "$dev" || true

# Millrace's transport on another port of the same address.
"$PROBE" "$RDMA_ADDR:4421" > "$work/probe.out" 2>&1 &
ppid_=$!
for _ in $(seq 50); do grep "listening on" "$work/probe.out" > /dev/null && break; sleep 0.2; done
grep "listening on $RDMA_ADDR:4421" "$work/probe.out" > /dev/null || { cat "$work/probe.out"; fail "the probe did not listen"; }
dmesg -C
if nvme discover -t rdma -a "$RDMA_ADDR" -s 4421 --hostnqn "$HOST" --hostid "$HOSTID" > "$work/pdisc" 2>&1; then
  fail "discovery through the refusing probe succeeded"
fi
sleep 0.5
grep "connect from $HOST to nqn.2014-08.org.nvmexpress.discovery refused" "$work/probe.out" > /dev/null \
  || { cat "$work/probe.out"; fail "the probe did not read the host's Connect data (RDMA READ of its keyed SGL)"; }
dmesg | grep "is not allowed, hostnqn: $HOST" > /dev/null \
  || { dmesg | tail; fail "the host did not see the refusal as 'host not allowed' (response SEND)"; }
kill "$ppid_"; ppid_=
step "Millrace's transport: CM accept, Connect data fetched by RDMA READ, refusal sent and understood"
step "PASS"
