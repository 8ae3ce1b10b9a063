#!/usr/bin/env bash
# Runs inside the guest (tests/guest/run-in-guest). Proves NVMe persistent reservations against
# the stock Linux initiator and nvme-cli: two hosts (two host NQNs and host identifiers, two
# controllers of one kernel) connect to one export; both register (`nvme resv-register`, A asking
# for persistence through power loss), A acquires write exclusive; B's writes fail with a
# reservation conflict while its reads work and A's writes work; `nvme resv-report --eds` from B
# shows both, A holding; `export list` and /metrics name the holder; A releases and B writes;
# B takes exclusive access and A's reads fail too; A preempts and aborts, B's registration goes;
# the operator's `millrace export nvme reservation clear` ends it all and B writes again.
# Each host's commands go through its own controller's character device (nvme-cli's -n);
# where the guest's nvme_core can be loaded with multipath off, each controller also has its own
# block device, and dd through B's is refused too (native multipath would join the two
# controllers' namespaces into one block device whose path, hence host, the kernel picks).
#   usage (on the host): cargo build -p millrace-cli -p millrace-server
#          tests/guest/run-in-guest --timeout 1200 tests/guest/nvme-resv.sh $PWD/target/debug
set -euo pipefail
DIR=$(realpath "${1:-$PWD/target/debug}")
MR=$DIR/millrace
[[ -x $MR ]] || { echo "nvme-resv: millrace is missing under $DIR; build it first (cargo build -p millrace-cli -p millrace-server)"; exit 1; }
IDA=4d696c6c-7261-6365-0000-0000000049a1
IDB=4d696c6c-7261-6365-0000-0000000049b1
HA=nqn.2014-08.org.nvmexpress:uuid:$IDA
HB=nqn.2014-08.org.nvmexpress:uuid:$IDB
NQN=nqn.2026-11.dev.millrace:tank.resv
KA=10 KB=11
work=$(mktemp -d /tmp/nvmeresv.XXXXXX)
export MILLRACE_HOME=$work/home MILLRACE_LOG=${MILLRACE_LOG:-info}
t0=$(date +%s)
step() { echo "nvme-resv: [$(( $(date +%s) - t0 ))s] $*"; }
fail() {
  echo "nvme-resv: FAILED: $*"
  echo "--- server log (tail) ---"; tail -40 "$work/server.log" 2>/dev/null || true
  echo "--- kernel log (tail) ---"; dmesg | grep -iE 'nvme' | tail -30 || true
  exit 1
}
cleanup() {
  nvme disconnect-all >/dev/null 2>&1 || true
  [[ -n ${spid:-} ]] && kill "$spid" 2>/dev/null || true
}
trap cleanup EXIT

# Multipath off where nvme_core is not loaded yet: each controller gets a block device.
[[ -d /sys/module/nvme_core ]] || modprobe nvme_core multipath=N || true
modprobe nvme-tcp || fail "cannot load nvme-tcp"
mpath=$(cat /sys/module/nvme_core/parameters/multipath 2>/dev/null || echo "?")

drives=()
for i in 0 1; do drives+=("$work/drives/d$i.img"); done
mkdir -p "$work/drives"
"$MR" pool create tank --level raid1 --create 64M "${drives[@]}" > "$work/pool.out" 2>&1 \
  || { cat "$work/pool.out"; fail "millrace pool create"; }
"$MR" volume create tank/resv --size 32M > /dev/null || fail "millrace volume create"
"$MR" serve --nvme 127.0.0.1:4420 --nvme 127.0.0.1:4421 >> "$work/server.log" 2>&1 &
spid=$!
for _ in $(seq 150); do
  [[ -s $MILLRACE_HOME/server.json ]] && (exec 3<>/dev/tcp/127.0.0.1/4421) 2>/dev/null && break
  kill -0 "$spid" 2>/dev/null || fail "millrace serve exited"
  sleep 0.3
done
"$MR" export nvme add tank/resv --host "$HA" --host "$HB" > "$work/export.out" 2>&1 \
  || { cat "$work/export.out"; fail "millrace export nvme add"; }

# nvme-cli refuses a second connect to an address and subsystem it is connected to, whatever
# the host NQN (2.3 even with -D): host B comes through the second listener.
connect() { # HOSTNQN HOSTID PORT
  nvme connect -t tcp -a 127.0.0.1 -s "$3" -n "$NQN" --hostnqn "$1" --hostid "$2" -i 1 > "$work/connect.out" 2>&1 \
    || { cat "$work/connect.out"; fail "nvme connect as $1"; }
}
ctrl_of() { # HOSTNQN: the controller (nvmeN) that host connected
  local c
  for c in /sys/class/nvme/nvme*; do
    [[ $(cat "$c/subsysnqn" 2>/dev/null) == "$NQN" && $(cat "$c/hostnqn" 2>/dev/null) == "$1" ]] \
      && { basename "$c"; return 0; }
  done
  return 1
}
connect "$HA" "$IDA" 4420
connect "$HB" "$IDB" 4421
for _ in $(seq 50); do ctrl_of "$HA" >/dev/null && ctrl_of "$HB" >/dev/null && break; sleep 0.2; done
ca=$(ctrl_of "$HA") || fail "host A has no controller"
cb=$(ctrl_of "$HB") || fail "host B has no controller"
[[ $ca != "$cb" ]] || fail "both hosts share controller $ca"
A=/dev/$ca B=/dev/$cb
for _ in $(seq 50); do [[ -c $A && -c $B ]] && break; sleep 0.2; done
blk=
if [[ $mpath == N ]]; then
  for _ in $(seq 50); do [[ -b ${A}n1 && -b ${B}n1 ]] && break; sleep 0.2; done
  [[ -b ${A}n1 && -b ${B}n1 ]] && blk=1
fi
step "host A on $A, host B on $B (multipath $mpath; per-host block devices: ${blk:-no})"

head -c 4096 /dev/urandom > "$work/a.bin"
head -c 4096 /dev/urandom > "$work/b.bin"
# A write or read of block 0 through a host's controller (NVMe passthrough on its character
# device); the output keeps nvme-cli's status line.
io() { # DEV write|read FILE
  case $2 in
    write) nvme io-passthru "$1" -n 1 --opcode=0x1 --write --data-len=4096 --input-file="$3" --cdw10=0 --cdw12=0 ;;
    read) nvme io-passthru "$1" -n 1 --opcode=0x2 --read --data-len=4096 --raw-binary --cdw10=0 --cdw12=0 > "$3" ;;
  esac > "$work/io.out" 2>&1
}
must() { io "$@" || { cat "$work/io.out"; fail "$2 through $1 failed"; }; }
conflicts() { # DEV write|read FILE
  io "$@" && fail "$2 through $1 succeeded where the reservation forbids it"
  grep -qi "reservation conflict" "$work/io.out" || { cat "$work/io.out"; fail "$2 through $1 failed, but not with a reservation conflict"; }
}
nv() { nvme "$@" > "$work/nv.out" 2>&1 || { cat "$work/nv.out"; fail "nvme $*"; }; }

nv resv-register "$A" -n 1 --nrkey=$KA --rrega=0 --cptpl=3
nv resv-register "$B" -n 1 --nrkey=$KB --rrega=0
nv resv-acquire "$A" -n 1 --crkey=$KA --rtype=1 --racqa=0
step "A and B registered (A with PTPL); A holds write exclusive"

must "$A" write "$work/a.bin"
conflicts "$B" write "$work/b.bin"
must "$B" read "$work/got.bin"
cmp -s "$work/got.bin" "$work/a.bin" || fail "B reads something other than what A wrote"
if [[ -n $blk ]]; then
  dd if="$work/b.bin" of="${B}n1" bs=4096 count=1 oflag=direct seek=1 > "$work/dd.out" 2>&1 \
    && fail "dd through B's block device wrote under A's reservation"
  why=$(grep -oiE "invalid exchange|input/output error" "$work/dd.out" | head -1) \
    || { cat "$work/dd.out"; fail "dd through B failed for another reason"; }
  dd if="$work/a.bin" of="${A}n1" bs=4096 count=1 oflag=direct seek=1 > "$work/dd.out" 2>&1 \
    || { cat "$work/dd.out"; fail "dd through A's block device"; }
  dd if="${B}n1" of=/dev/null bs=4096 count=2 iflag=direct > "$work/dd.out" 2>&1 \
    || { cat "$work/dd.out"; fail "dd read through B's block device"; }
  step "B's writes conflict (nvme: reservation conflict; dd: $why); its reads and A's writes work"
else
  step "B's writes conflict; its reads and A's writes work"
fi

nvme resv-report "$B" -n 1 --eds -o json > "$work/report.json" 2>&1 || { cat "$work/report.json"; fail "nvme resv-report --eds"; }
python3 - "$work/report.json" "$IDA" "$IDB" <<'EOF' || { cat "$work/report.json"; fail "the report does not show A holding and both registered"; }
import json, sys
r = json.load(open(sys.argv[1]))
ida, idb = (x.replace("-", "") for x in sys.argv[2:4])
regs = r.get("regctlext") or r.get("regctls") or []
assert r["rtype"] == 1 and r["regctl"] == 2 and r["ptpls"] == 1, r
by = {str(e["hostid"]).replace("-", "").lower(): e for e in regs}
assert by[ida]["rcsts"] == 1 and by[ida]["rkey"] == 10, by
assert by[idb]["rcsts"] == 0 and by[idb]["rkey"] == 11, by
EOF
nvme resv-report "$B" -n 1 > "$work/plain.out" 2>&1 && fail "a report without the extended structure was answered"
grep -qi "host identifier inconsistent" "$work/plain.out" || { cat "$work/plain.out"; fail "the non-extended report failed, but not for the host identifier format"; }
"$MR" export list > "$work/list" || fail "millrace export list"
grep -q "reservation write-exclusive held by $HA; 2 hosts registered (kept through restarts)" "$work/list" \
  || { cat "$work/list"; fail "export list does not show the reservation"; }
api=$(sed -n 's/^ *"url": *"\(.*\)",\?$/\1/p' "$MILLRACE_HOME/server.json")
if command -v curl > /dev/null; then
  curl -s "$api/metrics" > "$work/metrics" || fail "GET /metrics"
  grep -q "millrace_nvme_reservation_held{subsystem=\"$NQN\",nsid=\"1\",type=\"write-exclusive\",holder=\"$HA\"} 1" "$work/metrics" \
    && grep -q "millrace_nvme_reservation_registrants{subsystem=\"$NQN\",nsid=\"1\"} 2" "$work/metrics" \
    || { grep reservation "$work/metrics"; fail "/metrics does not show the reservation"; }
fi
ls "$MILLRACE_HOME"/nvme-reservations/*.json > /dev/null 2>&1 || fail "the reservation A asked to persist is not recorded in the home"
step "resv-report --eds shows both, A holding; without --eds refused; export list, /metrics and the record show it"

nv resv-release "$A" -n 1 --crkey=$KA --rtype=1 --rrela=0
must "$B" write "$work/b.bin"
nv resv-acquire "$B" -n 1 --crkey=$KB --rtype=2 --racqa=0
conflicts "$A" read "$work/got.bin"
conflicts "$A" write "$work/a.bin"
step "A released, B wrote; B holds exclusive access: A can neither read nor write"

nv resv-acquire "$A" -n 1 --crkey=$KA --prkey=$KB --rtype=1 --racqa=2
conflicts "$B" write "$work/b.bin"
must "$A" write "$work/a.bin"
nvme resv-report "$A" -n 1 --eds -o json > "$work/report.json" 2>&1 || fail "nvme resv-report after the preemption"
python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); assert r["regctl"] == 1 and r["rtype"] == 1, r' "$work/report.json" \
  || { cat "$work/report.json"; fail "after preempt and abort, B should be gone and A hold write exclusive"; }
nvme resv-acquire "$B" -n 1 --crkey=$KB --rtype=1 --racqa=0 > "$work/nv.out" 2>&1 && fail "B acquired with a registration that was preempted"
step "A preempted and aborted B: B is no registrant, its writes conflict"

"$MR" export nvme reservation clear tank/resv > "$work/clear.out" 2>&1 || { cat "$work/clear.out"; fail "millrace export nvme reservation clear"; }
must "$B" write "$work/b.bin"
nvme resv-report "$B" -n 1 --eds -o json > "$work/report.json" 2>&1 || fail "nvme resv-report after the clear"
python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); assert r["regctl"] == 0 and r["rtype"] == 0, r' "$work/report.json" \
  || { cat "$work/report.json"; fail "after the operator's clear, nothing should be registered or held"; }
step "the operator's clear: nothing registered or held, B writes"
step "PASS"
