#!/usr/bin/env bash
# run-in-guest: --disk 128M --disk 128M --disk 128M --disk 128M --disk 128M --disk 128M
# Runs inside the guest (tests/guest/run-in-guest). Proves NFS over RDMA for Millrace's shares
# (their pool a RAID6 on six virtio disks) on soft-RoCE: the kernel NFS server is started first, without RDMA (the case where Millrace
# finds nfsd running and must still add the RDMA listener); `millrace share create` turns on
# nfsd's RDMA listener (port 20049) and `share list` says so; the guest's NFS client mounts the
# share with proto=rdma,port=20049 as vers=3 and vers=4.2, writes files through both, and they
# read back identical through RDMA and through a TCP mount of the same share; after a restart
# of `millrace serve` the RDMA listener is still there. Where soft-RoCE cannot be set up (no
# rdma_rxe, no `rdma` tool), it fails saying what is missing.
#   usage (on the host): cargo build -p millrace-cli -p millrace-server
#          tests/guest/run-in-guest --timeout 1200 tests/guest/nfs-rdma.sh [target/debug]
set -euo pipefail
DIR=${1:-$PWD/target/debug}
M=$DIR/millrace
[[ -x $M ]] || { echo "nfs-rdma: $M is missing; build it first (cargo build -p millrace-cli -p millrace-server)"; exit 1; }
# shellcheck source=../lib/soft-roce.sh
source "$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../lib/soft-roce.sh"
work=$(mktemp -d /tmp/nfsrdma.XXXXXX)
export MILLRACE_HOME=$work/home
SHARE=/srv/millrace/tank/data
V4PATH=/millrace/tank/data
t0=$(date +%s)
step() { echo "nfs-rdma: [$(( $(date +%s) - t0 ))s] $*"; }
fail() {
  echo "nfs-rdma: FAILED: $*"
  echo "--- server log (tail) ---"; tail -40 "$work/serve.log" 2>/dev/null || true
  echo "--- kernel log (tail) ---"; dmesg | grep -iE 'rdma|rxe|nfs|svc|segfault|trap' | tail -30 || true
  echo "--- portlist ---"; cat /proc/fs/nfsd/portlist 2>/dev/null || true
  exit 1
}
cleanup() {
  for m in "$work"/r3 "$work"/r4 "$work"/t4; do umount -f -l "$m" 2>/dev/null || true; done
  [[ -n ${spid:-} ]] && kill "$spid" 2>/dev/null && wait "$spid" 2>/dev/null || true
  umount /srv 2>/dev/null || true
}
trap cleanup EXIT

# No soft-RoCE is a failure, not a skip: setup.sh installs what it needs and the guest's kernel
# has rdma_rxe, so a missing piece means NFS/RDMA would go untested.
soft_roce_up || fail "$SOFT_ROCE_WHY, so NFS/RDMA cannot be tested here"
soft_roce_prove || fail "rping over $RDMA_DEV failed: the soft-RoCE recipe does not work here"
step "soft-RoCE up: $RDMA_DEV on mr0 ($RDMA_ADDR), rping passes"

modprobe -a nbd nfsd xfs loop || fail "cannot load nbd / nfsd / xfs / loop"
# As in nfs-share.sh: /srv gets a file system of its own, exportable as the NFSv4 root.
truncate -s 32M "$work/srv.img" && mkfs.ext4 -q "$work/srv.img" && mount -o loop "$work/srv.img" /srv \
  || fail "cannot give /srv a file system of its own"
mountpoint -q /proc/fs/nfsd || mount -t nfsd nfsd /proc/fs/nfsd
echo 10 > /proc/fs/nfsd/nfsv4gracetime; echo 10 > /proc/fs/nfsd/nfsv4leasetime
# nfsd already running, TCP only, before Millrace starts: the case that used to leave RDMA off.
mkdir -p /var/lib/nfs/sm /var/lib/nfs/v4recovery; touch /etc/exports
rpcbind 2>/dev/null || true
rpc.nfsd -V 3 -V 4.2 4 || fail "cannot start nfsd"
grep -q rdma /proc/fs/nfsd/portlist && fail "nfsd listens for RDMA before Millrace asked"
step "nfsd running with TCP only: $(tr '\n' ' ' < /proc/fs/nfsd/portlist)"

# The pool's drives: the runner's virtio disks (this script's `# run-in-guest:` line).
read -ra drives <<< "${RUN_IN_GUEST_DISKS:-}"
((${#drives[@]} == 6)) || fail "expected the runner's 6 virtio disks, RUN_IN_GUEST_DISKS is '${RUN_IN_GUEST_DISKS:-}'"
"$M" pool create tank --level raid6 --strip 64k "${drives[@]}" > "$work/pool.out" 2>&1 || { cat "$work/pool.out"; fail "pool create on ${drives[*]}"; }
serve() {
  rm -f "$MILLRACE_HOME/server.json"
  "$M" serve --api 127.0.0.1:8740 --no-nvme >> "$work/serve.log" 2>&1 &
  spid=$!
  for _ in $(seq 600); do [[ -f $MILLRACE_HOME/server.json ]] && return 0; kill -0 "$spid" 2>/dev/null || break; sleep 0.2; done
  fail "millrace serve did not come up"
}
stop() { kill -TERM "$spid"; wait "$spid" || fail "millrace serve did not stop cleanly"; spid=; }
serve
"$M" share create tank/data --size 320M --client 127.0.0.1 --client 198.18.0.0/24 --no-root-squash \
  > "$work/create.out" 2>&1 || { cat "$work/create.out"; fail "share create"; }
grep -q "proto=rdma,port=20049" "$work/create.out" || { cat "$work/create.out"; fail "share create does not give the RDMA mount line"; }
grep -qx "rdma 20049" /proc/fs/nfsd/portlist || fail "share create did not add nfsd's RDMA listener"
"$M" share list > "$work/list.out" || fail "share list"
grep -q "RDMA (port 20049)" "$work/list.out" || { cat "$work/list.out"; fail "share list does not say RDMA is on"; }
"$M" share list --json | grep '"nfs_rdma_port": 20049' > /dev/null || fail "share list --json has no nfs_rdma_port 20049"
# The NFSv4 root (see nfs-share.sh): /srv, to both clients.
exportfs -o ro,fsid=0,crossmnt,no_subtree_check 127.0.0.1:/srv || fail "exporting the NFSv4 root /srv"
exportfs -o ro,fsid=0,crossmnt,no_subtree_check 198.18.0.0/24:/srv || fail "exporting the NFSv4 root /srv"
step "share created; nfsd listens for RDMA on 20049 and share list says so"

mkdir -p "$work/r3" "$work/r4" "$work/t4"
mount -t nfs -o vers=3,proto=rdma,port=20049 "$RDMA_ADDR:$SHARE" "$work/r3" || fail "mount vers=3 over RDMA"
mount -t nfs -o vers=4.2,proto=rdma,port=20049 "$RDMA_ADDR:$V4PATH" "$work/r4" || fail "mount vers=4.2 over RDMA"
grep -q " $work/r3 nfs .*proto=rdma" /proc/mounts || fail "the v3 mount is not over RDMA"
grep -q " $work/r4 nfs4 .*vers=4.2.*proto=rdma" /proc/mounts || fail "the v4.2 mount is not over RDMA"
step "mounted over RDMA: vers=3 and vers=4.2"

mkdir -p "$work/r3/v3" "$work/r4/v4"
for i in 1 2 3; do
  head -c $((i * 2 * 1024 * 1024 + 4097)) /dev/urandom > "$work/r3/v3/f$i"
  head -c $((i * 1024 * 1024 + 12345)) /dev/urandom > "$work/r4/v4/f$i"
done
cp /bin/bash "$work/r4/v4/bash"
sync
sums() { (cd "$1" && find . -type f -exec sha256sum {} + | sort -k2); }
sums "$work/r3" > "$work/sums.r3"
sums "$work/r4" > "$work/sums.r4"
cmp -s "$work/sums.r3" "$work/sums.r4" || fail "the v3 and v4.2 RDMA mounts see different files"
mount -t nfs -o vers=4.2,proto=tcp "127.0.0.1:$V4PATH" "$work/t4" || fail "mount vers=4.2 over TCP"
sums "$work/t4" > "$work/sums.t4"
cmp -s "$work/sums.r3" "$work/sums.t4" || { diff "$work/sums.r3" "$work/sums.t4" | head; fail "files written over RDMA read back differently over TCP"; }
(( $(wc -l < "$work/sums.t4") == 7 )) || fail "expected 7 files, the TCP mount lists $(wc -l < "$work/sums.t4")"
(cd "$work/t4/v3" && sha256sum f1 f2 f3) > "$work/direct"
(cd "$work/r3/v3" && sha256sum -c --quiet "$work/direct") || fail "checksums differ between the RDMA and TCP reads"
step "7 files written over RDMA (v3, v4.2) read back identical over RDMA and over TCP"

for m in r3 r4 t4; do umount "$work/$m" || fail "umount $m"; done
stop
serve
exportfs -o ro,fsid=0,crossmnt,no_subtree_check 198.18.0.0/24:/srv 2>/dev/null || true
grep -qx "rdma 20049" /proc/fs/nfsd/portlist || fail "nfsd has no RDMA listener after millrace serve restarted"
mount -t nfs -o vers=4.2,proto=rdma,port=20049 "$RDMA_ADDR:$V4PATH" "$work/r4" || fail "mount over RDMA after the restart"
sums "$work/r4" > "$work/sums.after"
cmp -s "$work/sums.r3" "$work/sums.after" || fail "files differ after the restart"
umount "$work/r4"
"$M" share delete tank/data > /dev/null || fail "share delete"
stop
step "PASS"
