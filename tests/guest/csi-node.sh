#!/usr/bin/env bash
# run-in-guest: --disk 512M --disk 512M --disk 512M
# Runs inside the guest (tests/guest/run-in-guest): the CSI driver's node service for real.
# `millrace serve` with a RAID5 pool on three virtio disks (1 GiB for volumes: the driver's
# guest test grows one to 768 MiB), the driver and csi-sanity all in the guest,
# so NodeStage connects over NVMe/TCP with the kernel initiator (nvme-cli) and finds the
# namespace by its UUID. csi-sanity's Node suite with raw block volumes; then the driver's guest
# test, where NodeStage makes xfs on a blank volume and mounts it: a file written through one
# publish reads back after unstage (disconnect) and restage, the volume and its filesystem grow,
# and a volume made where a deleted one lay reads as zeros; then csi-sanity's Node suite with
# filesystem volumes, one after another on the same space. Ends with
# no volume and no NVMe connection left.
#   usage (on the host): cargo build -p millrace-cli -p millrace-server && bash tests/csi/build-for-guest.sh target/debug
#          tests/guest/run-in-guest --timeout 1200 tests/guest/csi-node.sh $PWD/target/debug
set -euo pipefail
DIR=$(realpath "${1:-$PWD/target/debug}")
for b in millrace millrace-csi csi-sanity csi-guest.test; do
  [[ -x $DIR/$b ]] || { echo "csi-node: $DIR/$b is missing; build it first (see this script's usage)"; exit 1; }
done
NODE=nqn.2014-08.org.nvmexpress:uuid:6d696c6c-7261-6365-6373-690000000002
work=$(mktemp -d /tmp/csinode.XXXXXX)   # /tmp is tmpfs in the guest
export MILLRACE_HOME=$work/home MILLRACE_LOG=${MILLRACE_LOG:-info}
t0=$(date +%s)
step() { echo "csi-node: [$(( $(date +%s) - t0 ))s] $*"; }
fail() {
  echo "csi-node: FAILED: $*"
  echo "--- server log (tail) ---"; tail -30 "$work/server.log" 2>/dev/null || true
  echo "--- driver log (tail) ---"; tail -30 "$work/csi.log" 2>/dev/null || true
  echo "--- kernel log (tail) ---"; dmesg | grep -iE 'nvme|xfs' | tail -20 || true
  exit 1
}
cleanup() {
  [[ -n ${cpid:-} ]] && kill "$cpid" 2>/dev/null || true
  { grep " $work/" /proc/mounts || true; } | cut -d' ' -f2 | sort -r | while read -r m; do umount "$m" || true; done
  nvme disconnect-all >/dev/null 2>&1 || true
  [[ -n ${spid:-} ]] && kill "$spid" 2>/dev/null || true
}
trap cleanup EXIT
modprobe -a nvme-tcp xfs || fail "cannot load nvme-tcp / xfs"

# The pool's drives: the runner's virtio disks (this script's `# run-in-guest:` line).
read -ra drives <<< "${RUN_IN_GUEST_DISKS:-}"
((${#drives[@]} == 3)) || fail "expected the runner's 3 virtio disks, RUN_IN_GUEST_DISKS is '${RUN_IN_GUEST_DISKS:-}'"
"$DIR/millrace" pool create tank --level raid5 --strip 64k "${drives[@]}" \
  > "$work/pool.out" 2>&1 || { cat "$work/pool.out"; fail "millrace pool create on ${drives[*]}"; }
"$DIR/millrace" serve --api 127.0.0.1:0 --nvme 127.0.0.1:0 --discovery-port 0 >> "$work/server.log" 2>&1 &
spid=$!
for _ in $(seq 300); do
  [[ -s $MILLRACE_HOME/server.json ]] && break
  kill -0 "$spid" 2>/dev/null || fail "millrace serve exited"
  sleep 0.2
done
url=$(sed -n 's/.*"url": *"\([^"]*\)".*/\1/p' "$MILLRACE_HOME/server.json")
[[ -n $url ]] || fail "millrace serve did not start"
step "millrace serve at $url, pool tank (raid5 on ${drives[*]})"

sock=$work/csi.sock
# The guest is emulated (TCG) and shares two host cores with the host's suites: the first
# volume in fresh space deallocates all of it through RAID5, which can take longer than the
# driver's default 10 s per call there.
"$DIR/millrace-csi" --endpoint "unix://$sock" --mode all --node-id "$NODE" --server "$url" \
  --api-timeout 60s > "$work/csi.log" 2>&1 &
cpid=$!
for _ in $(seq 100); do [[ -S $sock ]] && break; sleep 0.2; done
[[ -S $sock ]] || fail "the driver did not start"
# sanity TYPE: csi-sanity's Node suite with volumes of that access type (block or mount).
sanity() {
  "$DIR/csi-sanity" --csi.endpoint "unix://$sock" --csi.stagingdir "$work/staging" --csi.mountdir "$work/mnt" \
    --csi.testvolumesize $((512 << 20)) --csi.testvolumeexpandsize $((640 << 20)) --csi.testvolumeaccesstype "$1" \
    --ginkgo.focus 'Node Service' --ginkgo.no-color --ginkgo.timeout 20m > "$work/sanity-$1.out" 2>&1 \
    || { tail -80 "$work/sanity-$1.out"; fail "csi-sanity's Node suite ($1 volumes)"; }
  grep -E "^(Ran|SUCCESS)" "$work/sanity-$1.out" || true
  step "csi-sanity Node suite passed with $1 volumes"
}
# Raw block volumes first: they connect, attach and bind the device, but write nothing, so the
# space they leave is blank for what follows.
sanity block
# A volume made where a deleted one lay must read as zeros: the server deallocates a volume's
# extent before it gives it out, and its allocation map answers reads of unwritten space with
# zeroes (#17). The test fails if the new volume shows the old one's data; with
# MILLRACE_GUEST_REQUIRE_BLANK=0 it only checks that the driver refuses such a volume (neither
# mounts nor overwrites it).
MILLRACE_GUEST_REQUIRE_BLANK=${MILLRACE_GUEST_REQUIRE_BLANK:-1}
MILLRACE_GUEST_REQUIRE_BLANK=$MILLRACE_GUEST_REQUIRE_BLANK \
MILLRACE_GUEST_SERVER=$url MILLRACE_GUEST_NODE=$NODE MILLRACE_GUEST_DIR=$work \
  "$DIR/csi-guest.test" -test.run TestGuest -test.v -test.count=1 > "$work/guest-test.out" 2>&1 \
  || { cat "$work/guest-test.out"; fail "the driver's guest test"; }
grep -q -- "--- PASS: TestGuest" "$work/guest-test.out" || { cat "$work/guest-test.out"; fail "the guest test did not run"; }
grep -o "KNOWN GAP.*" "$work/guest-test.out" || true
step "restage keeps the data, the volume and its xfs grow; a volume made where a deleted one lay is blank"

# Filesystem volumes in csi-sanity follow one another on the same space: each new one must be
# blank, or the driver would find the previous one's xfs and refuse it.
if [[ $MILLRACE_GUEST_REQUIRE_BLANK == 1 ]]; then
  sanity mount
else
  echo "csi-node: csi-sanity with filesystem volumes needs blank new volumes; MILLRACE_GUEST_REQUIRE_BLANK=0 skips it"
fi

left=$("$DIR/millrace" volume list --json | grep -c '"name"' || true)
[[ $left == 0 ]] || { "$DIR/millrace" volume list; fail "$left volumes are left after the tests"; }
conns=$(cat /sys/class/nvme/*/subsysnqn 2>/dev/null | grep -c "dev.millrace:csi:" || true)
[[ $conns == 0 ]] || fail "$conns NVMe connections are left after the tests"
step "no volume and no connection left"
