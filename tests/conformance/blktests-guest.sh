#!/usr/bin/env bash
# run-in-guest: --disk 1G
# Runs inside the guest (tests/guest/run-in-guest; tests/conformance/run-blktests.sh starts it):
# blktests' nvme tests against `millrace serve` over NVMe/TCP on the guest's loopback, through
# blktests' external-target hook (NVME_TARGET_CONTROL=tests/conformance/blktests-millrace-control).
# The pool is one raid0 on the runner's virtio disk. Results (blktests' own folder of them and
# the server's log) are left in OUT.
#   usage: blktests-guest.sh BUILD_DIR BLKTESTS_DIR OUT [TEST...]   (TEST: nvme/010 ...; default: nvme)
set -euo pipefail
DIR=$(realpath "$1") BT=$(realpath "$2") OUT=$3; shift 3
tests=("$@"); ((${#tests[@]})) || tests=(nvme)
MR=$DIR/millrace
here=$(cd "$(dirname "$0")" && pwd)
[[ -x $MR ]] || { echo "blktests-guest: millrace is missing under $DIR; build it first (cargo build -p millrace-cli)"; exit 1; }
[[ -x $BT/check ]] || { echo "blktests-guest: blktests is missing at $BT; run tests/conformance/get-blktests.sh"; exit 1; }
mkdir -p "$OUT"
work=$(mktemp -d /tmp/blktests.XXXXXX)   # /tmp is tmpfs in the guest
export MILLRACE=$MR MILLRACE_HOME=$work/home MILLRACE_LOG=${MILLRACE_LOG:-info}
cleanup() {
  nvme disconnect-all >/dev/null 2>&1 || true
  [[ -n ${spid:-} ]] && kill "$spid" 2>/dev/null || true
  cp "$work/server.log" "$OUT/server.log" 2>/dev/null || true
  cp -r "$work/results" "$OUT/results" 2>/dev/null || true
}
trap cleanup EXIT
modprobe -a nvme-tcp loop configfs || { echo "blktests-guest: cannot load nvme-tcp, loop and configfs"; exit 1; }
# blktests requires configfs for a TCP run even with an external target (it checks for the
# kernel target's tree); the guest's init does not mount it.
mountpoint -q /sys/kernel/config || mount -t configfs configfs /sys/kernel/config \
  || { echo "blktests-guest: cannot mount configfs at /sys/kernel/config"; exit 1; }

"$MR" serve --nvme 127.0.0.1:4420 > "$work/server.log" 2>&1 &
spid=$!
for _ in $(seq 150); do
  [[ -s $MILLRACE_HOME/server.json ]] && (exec 3<>/dev/tcp/127.0.0.1/4420) 2>/dev/null && break
  kill -0 "$spid" 2>/dev/null || { cat "$work/server.log"; echo "blktests-guest: millrace serve exited"; exit 1; }
  sleep 0.3
done
read -ra disks <<< "${RUN_IN_GUEST_DISKS:-}"
((${#disks[@]} == 1)) || { echo "blktests-guest: expected the runner's one virtio disk, RUN_IN_GUEST_DISKS is '${RUN_IN_GUEST_DISKS:-}'"; exit 1; }
"$here/blktests-millrace-control" prepare --drive "${disks[0]}" --size 512M

# The image size is the volume's: the fio tests write and verify NVME_IMG_SIZE bytes, and
# nvme/012 needs 350m at least.
cat > "$work/config" <<CFG
NVMET_TRTYPES=tcp
NVME_TARGET_CONTROL=$here/blktests-millrace-control
NVME_IMG_SIZE=512M
NVME_NUM_ITER=10
CFG
cd "$BT"   # blktests runs from its own folder (the overlay makes it writable here)
rc=0
# The results stay on the guest's tmpfs while the tests run: blktests makes its scratch images
# and loop devices under them, which the 9p share would make slow.
./check -c "$work/config" -o "$work/results" "${tests[@]}" 2>&1 | tee "$OUT/check.log" || rc=$?
"$here/blktests-millrace-control" teardown || true
# What a failed test printed (its .full), here in the log, not only in the results folder.
for bad in "$work"/results/*/*/*.out.bad; do
  [[ -e $bad ]] || continue
  echo "--- ${bad%.out.bad}.full (tail) ---"; tail -40 "${bad%.out.bad}.full" 2>/dev/null || true
done
# check's own status is not 0 when a test fails; the caller reads the table in check.log.
exit "$rc"
