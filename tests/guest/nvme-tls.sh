#!/usr/bin/env bash
# run-in-guest: --disk 112M --disk 112M
# ci-may-skip: SPDK v24.01 is no package; CI has it only where one is built (see below)
# Runs inside the guest (tests/guest/run-in-guest). Proves NVMe/TCP's secure channel (TLS 1.3
# with a PSK, TP 8011) of `millrace serve --nvme-tls required` against an independent host:
# SPDK v24.01's initiator (bdevperf, its ssl socket) attaches with the host's PSK and runs a
# verified write/read workload (`-w verify`: every block read back is compared); a host with
# a wrong PSK is refused; nvme-cli reads the discovery log: TLS 1.3 required (TREQ, TSAS). The guest
# kernel has kernel TLS (CONFIG_TLS=m), which the server hands the records to.
#
# SPDK is not packaged: without a built SPDK v24.01 (the second argument, MILLRACE_SPDK_DIR, or
# /work/spdk-generic, then /work/spdk-src/spdk, with build/examples/bdevperf) this script prints
# SKIPPED and exits 77, which is a skip, never a pass; so does an SPDK built for another CPU
# than the guest's (SPDK's default, -march=native, dies of an illegal instruction under the
# guest's emulated CPU when the host has AVX-512). To get one the guest runs:
#   git clone -b v24.01 --recursive https://github.com/spdk/spdk; cd spdk
#   ./configure --target-arch=x86-64-v2 --disable-tests --disable-unit-tests --disable-apps \
#     --without-nvme-cuse; make -j$(nproc)
# (scripts/bench-nvmf-spdk.sh uses an SPDK v24.01 tree too, built for the host.)
# SPDK v24.01 cannot derive its TLS PSK with OpenSSL 3.0 (Debian bookworm): it passes a NULL
# HKDF salt, which 3.0 refuses ("Unable to set salt for HKDF!"). tests/guest/spdk-hkdf-salt.c,
# preloaded into bdevperf, passes an empty salt instead (the same HKDF): built here with cc.
#   usage (on the host): cargo build -p millrace-cli -p millrace-server
#          tests/guest/run-in-guest --timeout 900 tests/guest/nvme-tls.sh $PWD/target/debug [SPDK_DIR]
# SPDK_DIR outside /tmp (the guest gets a fresh /tmp), built for the guest's CPU (see below).
set -euo pipefail
DIR=$(realpath "${1:-$PWD/target/debug}")
MR=$DIR/millrace
HERE=$(dirname "$(realpath "$0")")
# The runner passes no environment: the SPDK tree may come as the second argument too.
# Else the first of: a tree built for a common CPU (as below), the one the benchmarks build.
spdk_default=/work/spdk-src/spdk
[[ -x /work/spdk-generic/build/examples/bdevperf ]] && spdk_default=/work/spdk-generic
SPDK=${2:-${MILLRACE_SPDK_DIR:-$spdk_default}}
[[ -x $MR ]] || { echo "nvme-tls: millrace is missing under $DIR; build it first (cargo build -p millrace-cli -p millrace-server)"; exit 1; }
# How to build an SPDK the guest can run, said in every skip below.
build_spdk='./configure --target-arch=x86-64-v2 --disable-tests --disable-unit-tests --disable-apps --without-nvme-cuse; make'
if [[ ! -x $SPDK/build/examples/bdevperf ]]; then
  echo "nvme-tls: SKIPPED: no built SPDK v24.01 at $SPDK; get one (git clone -b v24.01 --recursive https://github.com/spdk/spdk; cd spdk; $build_spdk) outside /tmp and pass its tree as the second argument"
  exit 77
fi
# SPDK's default build is for the CPU it was built on (-march=native); the guest's emulated
# CPU may lack what it uses (AVX-512): a skip, with what to do, not a failure of Millrace's.
rc=0; "$SPDK/build/examples/bdevperf" --help > /dev/null 2>&1 || rc=$?
if ((rc == 132)); then
  echo "nvme-tls: SKIPPED: $SPDK/build/examples/bdevperf dies of an illegal instruction on the guest's CPU; build SPDK for a common CPU ($build_spdk) and pass its tree as the second argument"
  exit 77
fi
# It may also pass --help and still stop in DPDK's start-up check (RDSEED, which the emulated CPU
# lacks): a start with no devices finds that out before the pool and the server are set up (with
# 64 MB, too little for its threads, bdevperf stops right after that check, which is all this needs).
none=$(mktemp /tmp/nvmetls-none.XXXXXX.json); echo '{"subsystems":[]}' > "$none"
probe=$(timeout 60 "$SPDK/build/examples/bdevperf" --no-huge -s 64 -m 0x1 --json "$none" -q 1 -o 4096 -w read -t 1 2>&1 || true)
rm -f "$none"
# other_cpu OUTPUT: where bdevperf's OUTPUT says DPDK refused the CPU, skip, naming what it lacks.
other_cpu() {
  [[ $1 == *"unsupported cpu type"* ]] || return 0
  echo "nvme-tls: SKIPPED: $SPDK was built for another CPU than the guest's (DPDK: $(grep -m1 -o 'does not support "[A-Z0-9_]*"' <<< "$1" || echo 'unsupported cpu type')); build SPDK for a common CPU ($build_spdk) and pass its tree as the second argument"
  exit 77
}
other_cpu "$probe"
HOST=nqn.2014-08.org.nvmexpress:uuid:4d696c6c-7261-6365-0000-000000000011
HOST384=nqn.2014-08.org.nvmexpress:uuid:4d696c6c-7261-6365-0000-000000000012
NQN=nqn.2026-11.dev.millrace:tank.tls
work=$(mktemp -d /tmp/nvmetls.XXXXXX)
export MILLRACE_HOME=$work/home MILLRACE_LOG=${MILLRACE_LOG:-info}
t0=$(date +%s)
step() { echo "nvme-tls: [$(( $(date +%s) - t0 ))s] $*"; }
fail() {
  echo "nvme-tls: FAILED: $*"
  echo "--- server log (tail) ---"; tail -40 "$work/server.log" 2>/dev/null || true
  exit 1
}
cleanup() { [[ -n ${spid:-} ]] && kill "$spid" 2>/dev/null || true; }
trap cleanup EXIT

modprobe tls 2>/dev/null || true
cc -shared -fPIC -o "$work/salt.so" "$HERE/spdk-hkdf-salt.c" -ldl || fail "cannot build tests/guest/spdk-hkdf-salt.c (cc)"

read -ra disks <<< "${RUN_IN_GUEST_DISKS:-}"
((${#disks[@]} == 2)) || fail "expected the runner's 2 virtio disks, RUN_IN_GUEST_DISKS is '${RUN_IN_GUEST_DISKS:-}'"
"$MR" pool create tank --level raid1 "${disks[@]}" > "$work/pool.out" 2>&1 || { cat "$work/pool.out"; fail "pool create"; }
"$MR" volume create tank/tls --size 64M > /dev/null || fail "volume create"
"$MR" export nvme add tank/tls --host "$HOST" > /dev/null || fail "export nvme add"
# The host's PSK (hash 01: SHA-256, 32 bytes), and another for the wrong host.
psk() { python3 -c 'import base64,os,sys,zlib; k=os.urandom(int(sys.argv[1])); sys.stdout.write("NVMeTLSkey-1:%s:%s:" % (sys.argv[2], base64.b64encode(k+zlib.crc32(k).to_bytes(4,"little")).decode()))' "$@"; }
umask 077   # (no newline after the key: SPDK reads the file as it is)
psk 32 01 > "$work/host.psk"; psk 32 01 > "$work/wrong.psk"; psk 48 02 > "$work/host384.psk"
"$MR" export nvme host set-key tank/tls "$HOST" --tls-psk "$work/host.psk" > /dev/null || fail "host set-key --tls-psk"
"$MR" export nvme host add tank/tls "$HOST384" --tls-psk "$work/host384.psk" > /dev/null || fail "host add --tls-psk"
[[ $("$MR" export nvme list) == *"$HOST384 (tls psk)"* ]] || fail "export nvme list does not show the hosts' PSKs"
"$MR" serve --nvme 127.0.0.1:4420 --nvme-tls required >> "$work/server.log" 2>&1 &
spid=$!
for _ in $(seq 150); do
  [[ -s $MILLRACE_HOME/server.json ]] && (exec 3<>/dev/tcp/127.0.0.1/8009) 2>/dev/null && break
  kill -0 "$spid" 2>/dev/null || fail "millrace serve exited"
  sleep 0.3
done
step "serving tank/tls with TLS required"
# The discovery log (plain, port 8009) as nvme-cli reads it: TLS 1.3 required on 4420.
modprobe nvme-tcp 2>/dev/null || true
nvme discover -t tcp -a 127.0.0.1 -s 8009 -q "$HOST" > "$work/disc.out" 2>&1 || { cat "$work/disc.out"; fail "nvme discover"; }
grep -qE "treq: *required" "$work/disc.out" && grep -qE "sectype: *tls13" "$work/disc.out" \
  || { cat "$work/disc.out"; fail "the discovery log does not say TLS 1.3 is required"; }
step "the discovery log says: treq required, sectype tls13"

bdevperf() { # PSKFILE SECONDS [HOSTNQN] -> runs SPDK's bdevperf, output in $work/bdevperf.out
  cat > "$work/bdev.json" <<JSON
{"subsystems":[{"subsystem":"bdev","config":[{"method":"bdev_nvme_attach_controller","params":
 {"name":"Nvme0","trtype":"tcp","adrfam":"ipv4","traddr":"127.0.0.1","trsvcid":"4420",
  "subnqn":"$NQN","hostnqn":"${3:-$HOST}","psk":"$1"}}]}]}
JSON
  LD_PRELOAD=$work/salt.so timeout 300 "$SPDK/build/examples/bdevperf" --no-huge -s 512 -m 0x1 \
    --json "$work/bdev.json" -q 16 -o 4096 -w verify -t "$2" > "$work/bdevperf.out" 2>&1
}
if ! bdevperf "$work/host.psk" 10; then
  # (The probe above should have caught this; a skip all the same.)
  other_cpu "$(cat "$work/bdevperf.out")"
  cat "$work/bdevperf.out"; fail "bdevperf with the host's PSK"
fi
grep -qE "Nvme0n1 .*IOPS|Nvme0n1" "$work/bdevperf.out" || { cat "$work/bdevperf.out"; fail "bdevperf ran no I/O"; }
grep -qiE "miscompare|error" "$work/bdevperf.out" && { cat "$work/bdevperf.out"; fail "bdevperf reports errors"; }
tail -5 "$work/bdevperf.out"
step "SPDK's initiator over TLS (TLS_AES_128_GCM_SHA256): verified 4 KiB writes and reads"
bdevperf "$work/host384.psk" 5 "$HOST384" || { cat "$work/bdevperf.out"; fail "bdevperf with a 48-byte PSK"; }
grep -q "Nvme0n1" "$work/bdevperf.out" && ! grep -qiE "miscompare|error" "$work/bdevperf.out" \
  || { cat "$work/bdevperf.out"; fail "bdevperf with a 48-byte PSK ran no clean I/O"; }
step "SPDK's initiator over TLS (TLS_AES_256_GCM_SHA384, hash 02): verified 4 KiB writes and reads"

if bdevperf "$work/wrong.psk" 3 && grep -q "Nvme0n1" "$work/bdevperf.out" && ! grep -qiE "error|fail" "$work/bdevperf.out"; then
  cat "$work/bdevperf.out"; fail "a host with a wrong PSK was served"
fi
grep -q "PSK differs from the one configured" "$work/server.log" || fail "the server logged no refusal of the wrong PSK"
step "a wrong PSK is refused"
kill -0 "$spid" || fail "the server ended"
for f in host wrong host384; do
  ! grep -qF "$(cut -d: -f3 "$work/$f.psk")" "$work/server.log" || fail "a PSK appears in the server's log"
done
[[ $("$MR" export nvme list --json) != *"$(cut -d: -f3 "$work/host.psk")"* ]] || fail "export list shows the PSK"
echo "nvme-tls: PASS"
