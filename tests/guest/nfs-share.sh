#!/usr/bin/env bash
# run-in-guest: --disk 128M --disk 128M --disk 128M --disk 128M --disk 128M --disk 128M
# Runs inside the guest (tests/guest/run-in-guest). Proves `millrace share` end to end with the
# stock kernel: a share (volume of a RAID6 pool on six virtio disks -> kernel NBD client on the
# share's Unix socket -> XFS -> kernel NFS server) mounted by the guest's own NFS client over loopback with vers=3 and vers=4.2; a
# dataset of small and large files whose checksums match; a drive failed while it is read, with
# no client error; `millrace serve` restarted (shares taken down cleanly and rebuilt); the drives
# imported into another running server (the share comes back with the import); a client
# outside the list refused; and `share delete` leaving no mount, export or attached device.
#   usage (on the host): cargo build -p millrace-cli -p millrace-server
#          tests/guest/run-in-guest --timeout 1200 tests/guest/nfs-share.sh [target/debug]
set -euo pipefail
DIR=${1:-$PWD/target/debug}
M=$DIR/millrace
[[ -x $M ]] || { echo "nfs-share: $M is missing; build it first (cargo build -p millrace-cli -p millrace-server)"; exit 1; }
work=$(mktemp -d /tmp/nfsshare.XXXXXX)
export MILLRACE_HOME=$work/home
SHARE=/srv/millrace/tank/data
t0=$(date +%s)
step() { echo "nfs-share: [$(( $(date +%s) - t0 ))s] $*"; }
fail() {
  echo "nfs-share: FAILED: $*"
  echo "--- server log (tail) ---"; tail -40 "$work/serve.log" 2>/dev/null || true
  echo "--- kernel log (tail) ---"; dmesg | grep -iE 'nbd|xfs|nfs|block' | tail -30 || true
  echo "--- mounts ---"; grep -E 'nbd|nfs|millrace' /proc/mounts || true
  exit 1
}
cleanup() {
  for m in "$work"/m3 "$work"/m4 "$work"/bad; do umount -f -l "$m" 2>/dev/null || true; done
  [[ -n ${spid:-} ]] && kill "$spid" 2>/dev/null && wait "$spid" 2>/dev/null || true
  umount /srv 2>/dev/null || true
}
trap cleanup EXIT

serve() {
  rm -f "$MILLRACE_HOME/server.json"
  "$M" serve --api 127.0.0.1:8740 --no-nvme >> "$work/serve.log" 2>&1 &
  spid=$!
  for _ in $(seq 600); do [[ -f $MILLRACE_HOME/server.json ]] && return 0; kill -0 "$spid" 2>/dev/null || break; sleep 0.2; done
  fail "millrace serve did not come up"
}
stop() {
  kill -TERM "$spid"
  wait "$spid" || fail "millrace serve did not stop cleanly (status $?)"
  spid=
}
mount_both() {
  mkdir -p "$work/m3" "$work/m4"
  mount -t nfs -o vers=3 "127.0.0.1:$SHARE" "$work/m3" || fail "mount -o vers=3"
  mount -t nfs -o vers=4.2 "127.0.0.1:$V4PATH" "$work/m4" || fail "mount -o vers=4.2"
  grep -q " $work/m3 nfs .*vers=3" /proc/mounts || fail "the v3 mount is not NFSv3"
  grep -q " $work/m4 nfs4 .*vers=4.2" /proc/mounts || fail "the v4.2 mount is not NFSv4.2"
}
umount_both() { umount "$work/m3" && umount "$work/m4" || fail "umount of the NFS mounts"; }
sums() { (cd "$1" && find . -type f -exec sha256sum {} + | sort -k2); }
nbd_attached() { for s in /sys/block/nbd*/size; do [[ $(cat "$s") != 0 ]] && return 0; done; return 1; }

modprobe -a nbd nfsd xfs loop || fail "cannot load nbd / nfsd / xfs / loop"
# NFSv4 reaches a share through a pseudo file system rooted at the server's "/". The guest's
# "/" is an overlay of a 9p mount, which the kernel cannot export ("Cannot export /"), so here
# /srv gets an ext4 of its own and is the explicit NFSv4 root (fsid=0): v4 clients mount
# /millrace/tank/data. On a host whose root is a real file system, v4 paths are the v3 paths.
truncate -s 32M "$work/srv.img" && mkfs.ext4 -q "$work/srv.img" && mount -o loop "$work/srv.img" /srv \
  || fail "cannot give /srv a file system of its own"
V4PATH=/millrace/tank/data
# A fresh NFS server holds NFSv4 opens back for a grace period (90 s by default); the test
# shortens it before millrace starts nfsd (these can only be set while nfsd has no threads).
mountpoint -q /proc/fs/nfsd || mount -t nfsd nfsd /proc/fs/nfsd
echo 10 > /proc/fs/nfsd/nfsv4gracetime; echo 10 > /proc/fs/nfsd/nfsv4leasetime

# The pool's drives: the runner's virtio disks (this script's `# run-in-guest:` line).
read -ra drives <<< "${RUN_IN_GUEST_DISKS:-}"
((${#drives[@]} == 6)) || fail "expected the runner's 6 virtio disks, RUN_IN_GUEST_DISKS is '${RUN_IN_GUEST_DISKS:-}'"
"$M" pool create tank --level raid6 --strip 64k "${drives[@]}" > "$work/pool.out" 2>&1 || { cat "$work/pool.out"; fail "pool create on ${drives[*]}"; }
serve
# The server's threads are I/O flushers (PF_MEMALLOC_NOIO, 0x80000): writeback through the
# kernel NBD client cannot deadlock on their allocations.
noio=0
for t in /proc/$spid/task/*/stat; do (( $(awk '{print $9}' "$t") & 0x80000 )) && noio=$((noio + 1)); done
((noio > 0)) || fail "no thread of millrace serve is an I/O flusher (PR_SET_IO_FLUSHER)"
step "server up (pid $spid, $noio threads are I/O flushers)"

# Without clients a share is refused, and so is a client that is not an address or name.
"$M" share create tank/data --size 320M --client 'a b' > "$work/bad.out" 2>&1 && fail "a client 'a b' was accepted"
grep -q "not an NFS client" "$work/bad.out" || { cat "$work/bad.out"; fail "no sentence for a bad client"; }
"$M" share create tank/data --size 320M --client 127.0.0.1 > "$work/create.out" 2>&1 || { cat "$work/create.out"; fail "share create"; }
cat "$work/create.out"
dev=$("$M" share list --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["shares"][0]["nbd_device"])')
[[ -b $dev ]] || fail "share list names no attached device ($dev)"
opts=$(awk -v d="$dev" -v m="$SHARE" '$1 == d && $2 == m && $3 == "xfs" {print $4}' /proc/mounts)
for o in noatime largeio swalloc inode64 logbsize=256k; do
  [[ ,$opts, == *,$o,* ]] || { grep "$SHARE" /proc/mounts; fail "$SHARE is not mounted from $dev with $o"; }
done
xfs_info "$SHARE" > "$work/xfs_info"
grep -qE 'sunit=16 +swidth=64 blks' "$work/xfs_info" || { cat "$work/xfs_info"; fail "XFS is not aligned to the 64 KiB strip x 4 data drives"; }
exportfs -v | tr -d '\n' | grep "$SHARE.*127.0.0.1(.*sync.*no_wdelay.*root_squash" >/dev/null || { exportfs -v; fail "exportfs does not show the share to 127.0.0.1 sync,no_wdelay,root_squash"; }
grep -qw '+3' /proc/fs/nfsd/versions && grep -qw '+4.2' /proc/fs/nfsd/versions || { cat /proc/fs/nfsd/versions; fail "nfsd does not offer v3 and v4.2"; }
step "share created: $dev, XFS su=64k sw=4, exported; nfsd $(cat /proc/fs/nfsd/threads) threads, versions $(cat /proc/fs/nfsd/versions)"

# Root is squashed to nobody: the share's owner opens its root on the server.
chmod 1777 "$SHARE"
exportfs -o ro,fsid=0,crossmnt,no_subtree_check 127.0.0.1:/srv || fail "exporting the NFSv4 root /srv"
mount_both
step "mounted over NFSv3 and NFSv4.2"

# The dataset: many small files in folders, a few large ones with odd sizes.
src=$work/src
mkdir -p "$src"
# One process writes the 300 small files: on the guest's emulated CPU a process start costs tens
# of milliseconds, and a `head` per file took a minute.
python3 - "$src/small" <<'PY' || fail "writing the small files of the dataset"
import os, sys
for d in range(10):
    os.makedirs(f"{sys.argv[1]}/{d}", exist_ok=True)
    for f in range(30):
        with open(f"{sys.argv[1]}/{d}/f{f}", "wb") as out:
            out.write(os.urandom((d * 30 + f) * 97 % 16384 + 1))
PY
mkdir -p "$src/large"
for i in 1 2 3; do head -c $(( i * 3 * 1024 * 1024 + i * 4099 )) /dev/urandom > "$src/large/blob$i"; done
sums "$src" > "$work/sums.src"
cp -r "$src/small" "$work/m3/" || fail "writing the small files over NFSv3"
cp -r "$src/large" "$work/m4/" || fail "writing the large files over NFSv4.2"
sync
[[ $(stat -c %u "$work/m4/large/blob1") == 65534 ]] || fail "root was not squashed (blob1 is owned by uid $(stat -c %u "$work/m4/large/blob1"))"
echo 3 > /proc/sys/vm/drop_caches
sums "$work/m3" > "$work/sums.v3"
sums "$work/m4" > "$work/sums.v4"
cmp -s "$work/sums.src" "$work/sums.v3" || { diff "$work/sums.src" "$work/sums.v3" | head; fail "checksums differ over NFSv3"; }
cmp -s "$work/sums.src" "$work/sums.v4" || { diff "$work/sums.src" "$work/sums.v4" | head; fail "checksums differ over NFSv4.2"; }
step "dataset written ($(wc -l < "$work/sums.src") files, $(du -sh "$src" | cut -f1)); checksums match over v3 and v4.2"

# A drive fails while clients read everything: no client sees an error.
echo 3 > /proc/sys/vm/drop_caches
( sums "$work/m3" > "$work/sums.fail3" ) & r3=$!
( sums "$work/m4" > "$work/sums.fail4" ) & r4=$!
sleep 1
"$M" pool fail tank "${drives[2]}" || fail "pool fail tank ${drives[2]}"
wait "$r3" || fail "a read over NFSv3 failed while a drive failed"
wait "$r4" || fail "a read over NFSv4.2 failed while a drive failed"
cmp -s "$work/sums.src" "$work/sums.fail3" || fail "checksums differ over NFSv3 across the drive failure"
cmp -s "$work/sums.src" "$work/sums.fail4" || fail "checksums differ over NFSv4.2 across the drive failure"
"$M" pool show tank --json | grep '"degraded' >/dev/null || fail "the pool is not degraded after the failure"
step "drive ${drives[2]} failed during the reads: no client error, checksums match, pool degraded"

# Restart: a clean stop takes the share down (unexport, unmount, detach) even while clients
# keep it mounted (nfsd holds it then; the server restarts nfsd's threads to let go), and start
# rebuilds it. The clients' file handles carry the share's fsid, so their mounts work again.
stop
grep -q " $SHARE " /proc/mounts && fail "$SHARE is still mounted after the server stopped"
nbd_attached && fail "an NBD device is still attached after the server stopped"
exportfs -v | grep "$SHARE" >/dev/null && fail "$SHARE is still exported after the server stopped"
step "server stopped with clients mounted: share unexported, unmounted, detached"
serve
"$M" share list > "$work/list.out" || fail "share list"
grep -q "exported" "$work/list.out" || { cat "$work/list.out"; fail "the share is not exported again after the restart"; }
sums "$work/m3" > "$work/sums.k3" || fail "reading through the v3 mount kept across the restart"
sums "$work/m4" > "$work/sums.k4" || fail "reading through the v4.2 mount kept across the restart"
cmp -s "$work/sums.src" "$work/sums.k3" || fail "checksums differ through the v3 mount kept across the restart"
cmp -s "$work/sums.src" "$work/sums.k4" || fail "checksums differ through the v4.2 mount kept across the restart"
step "mounts kept across the restart read the same data"
umount_both
mount_both
sums "$work/m3" > "$work/sums.r3"
sums "$work/m4" > "$work/sums.r4"
cmp -s "$work/sums.src" "$work/sums.r3" || fail "checksums differ over NFSv3 after the restart"
cmp -s "$work/sums.src" "$work/sums.r4" || fail "checksums differ over NFSv4.2 after the restart"
step "restarted, remounted: data intact over v3 and v4.2"

# Drives moved to a server that has never seen the pool (a home of its own) and imported while
# it runs: the share comes back with the import, not only at that server's next start.
umount_both
stop
home1=$MILLRACE_HOME
export MILLRACE_HOME=$work/home2
serve
[[ $("$M" pool list --json | python3 -c 'import json,sys; d=json.load(sys.stdin); print(len(d["pools"] if isinstance(d, dict) else d))') == 0 ]] \
  || fail "the second server already knows a pool before the import"
"$M" pool import "${drives[@]}" > "$work/import.out" 2>&1 || { cat "$work/import.out"; fail "pool import into the running server"; }
"$M" share list > "$work/list2.out" || fail "share list after the import"
grep -q "exported" "$work/list2.out" || { cat "$work/import.out" "$work/list2.out"; fail "the share did not come back with the import"; }
mount_both
sums "$work/m3" > "$work/sums.i3"
sums "$work/m4" > "$work/sums.i4"
cmp -s "$work/sums.src" "$work/sums.i3" || fail "checksums differ over NFSv3 after the import"
cmp -s "$work/sums.src" "$work/sums.i4" || fail "checksums differ over NFSv4.2 after the import"
umount_both
stop
export MILLRACE_HOME=$home1
serve
mount_both
step "imported into a running server: the share came back with the import, data intact"

# A client outside the list is refused. 127.0.0.0/8 routes answer from 127.0.0.1, so the
# stranger gets an address of its own on the loopback device and mounts through it.
ip addr add 10.9.9.1/32 dev lo
mkdir -p "$work/bad"
if timeout 120 mount -t nfs -o vers=3,retry=0 "10.9.9.1:$SHARE" "$work/bad" > "$work/bad3.out" 2>&1; then
  fail "a client outside the list (10.9.9.1) mounted the share over NFSv3"
fi
grep -qi "access denied" "$work/bad3.out" || { cat "$work/bad3.out"; fail "the v3 refusal is not 'access denied'"; }
if timeout 120 mount -t nfs -o vers=4.2,retry=0 "10.9.9.1:$V4PATH" "$work/bad" > "$work/bad4.out" 2>&1; then
  fail "a client outside the list (10.9.9.1) mounted the share over NFSv4.2"
fi
step "a client outside the list is refused (v3: $(tr -d '\n' < "$work/bad3.out" | cut -c1-80))"

# Delete undoes every step, while no client holds it.
umount_both
"$M" share delete tank/data || fail "share delete"
grep -q " $SHARE " /proc/mounts && fail "$SHARE is still mounted after share delete"
exportfs -v | grep "$SHARE" >/dev/null && fail "$SHARE is still exported after share delete"
nbd_attached && fail "an NBD device is still attached after share delete"
[[ -e $SHARE ]] && fail "the mountpoint $SHARE is still there"
"$M" volume list tank | grep data >/dev/null && fail "the share's volume is still there"
[[ $("$M" share list --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["shares"]))') == 0 ]] || fail "share list is not empty"
"$M" export nbd list --json | grep tank/data >/dev/null && fail "the share's NBD export is still there"
step "share delete left no mount, export, device, volume or NBD export"
stop
step "PASS"
