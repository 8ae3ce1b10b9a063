#!/usr/bin/env bash
# Runs inside the guest (tests/guest/run-in-guest). Proves that Millrace's RAID5 and RAID6 data
# areas are Linux md's left-symmetric layout with md's parity math: Linux md, assembled over the
# same drive files with the same chunk, layout and data offset, reads the same bytes, and md's
# own parity check ("check" sync action) finds no mismatch.
set -euo pipefail
# The guest gets no environment: the folder of built binaries comes as the first argument.
M=${1:-$PWD/target/debug}/millrace
[[ -x $M ]] || { echo "md-compat: $M is missing; build it first (cargo build --workspace --bins --examples)"; exit 1; }
modprobe -a raid456 loop
work=$(mktemp -d /tmp/mdcompat.XXXXXX)
export MILLRACE_HOME=$work/home
fail() { echo "md-compat: FAILED: $*"; exit 1; }

check_level() {
  local level=$1 n=$2 extra=${3:-}
  local d=("$work"/r$level-d{0..9}.img); d=("${d[@]:0:$n}")
  $M pool create p$level --level raid$level --strip 64k --create 24M --data-offset 1M "${d[@]}" >/dev/null
  local size; size=$($M pool show p$level --json | sed -n 's/.*"size_bytes": \([0-9]*\).*/\1/p')
  # Full stripes, partial stripes (read-modify-write and reconstruct-write) and unaligned bytes.
  head -c $((size / 2)) /dev/urandom > "$work/a"
  $M io write p$level --offset 0 --input "$work/a"
  for off in 12345 $((size / 3)) $((size - 70000)); do
    head -c 50000 /dev/urandom | $M io write p$level --offset $off
  done
  head -c 4096 /dev/urandom | $M io write p$level --offset $((size / 2 + 65536 * 3))
  $M io read p$level --offset 0 --length "$size" --output "$work/ours"

  local loops=()
  for f in "${d[@]}"; do loops+=("$(losetup -f --show "$f")"); done
  mdadm --create /dev/md/t$level --run --assume-clean --metadata=1.2 --level=$level \
      --raid-devices=$n --chunk=64 --layout=left-symmetric --data-offset=1M --bitmap=none \
      "${loops[@]}" < /dev/null > "$work/mdadm.log" 2>&1 || { cat "$work/mdadm.log"; fail "mdadm --create for raid$level"; }
  local md; md=$(readlink -f /dev/md/t$level)
  local mdsize; mdsize=$(blockdev --getsize64 "$md")
  [[ $mdsize -ge $size ]] || fail "md's raid$level is $mdsize bytes, smaller than ours ($size)"
  head -c "$size" "$md" | cmp - "$work/ours" || fail "md reads different bytes than Millrace for raid$level"
  local name; name=$(basename "$md")
  echo check > /sys/block/$name/md/sync_action
  sleep 1
  while [[ $(cat /sys/block/$name/md/sync_action) != idle ]]; do sleep 1; done
  local mm; mm=$(cat /sys/block/$name/md/mismatch_cnt)
  # The control: damage one strip behind md's back; the same check must now see it.
  dd if=/dev/urandom of="${loops[1]}" bs=64k count=1 seek=$((1024 / 64 + 3)) conv=notrunc,fsync status=none
  echo 3 > /proc/sys/vm/drop_caches
  echo check > /sys/block/$name/md/sync_action
  sleep 1
  while [[ $(cat /sys/block/$name/md/sync_action) != idle ]]; do sleep 1; done
  local bad; bad=$(cat /sys/block/$name/md/mismatch_cnt)
  mdadm --stop "$md" >/dev/null 2>&1
  for l in "${loops[@]}"; do losetup -d "$l"; done
  [[ $mm == 0 ]] || fail "md's parity check found $mm mismatched sectors in raid$level"
  [[ $bad -gt 0 ]] || fail "md's parity check did not notice a damaged strip, so its clean result proves nothing"
  echo "md-compat: raid$level on $n drives: md reads the same $size bytes, parity check clean"
}

check_level 5 5
check_level 6 6

# Block devices as members, not just files: a RAID6 on loop devices, written and read back.
blk=()
for i in 0 1 2 3; do truncate -s 40M "$work/b$i.img"; blk+=("$(losetup -f --show "$work/b$i.img")"); done
$M pool create blk --level raid6 --strip 64k "${blk[@]}" >/dev/null || fail "pool create on block devices"
head -c 20000000 /dev/urandom > "$work/bd"
$M io write blk --offset 4097 --input "$work/bd"
$M io read blk --offset 4097 --length 20000000 | cmp - "$work/bd" || fail "block-device pool reads different bytes"
$M pool show blk --json | grep '"path": "/dev/loop' >/dev/null || fail "pool show does not list the block devices"
for l in "${blk[@]}"; do losetup -d "$l"; done
echo "md-compat: RAID6 on block devices (loop) round-trips"
# Writes merged in flight (issue #15): 128K writes at QD16 on one core's io_uring, merged into
# full stripes by the engine (examples/merge_cost), then md over the same files: md reads the
# bytes written and its parity check finds no mismatch.
X=$(dirname "$M")/examples/merge_cost
[[ -x $X ]] || fail "$X is missing; build it first (cargo build --workspace --bins --examples)"
mkdir "$work/merged"
MERGE_COST_KEEP=$work/merged DIR=$work "$X" raid6 6 65536 131072 16 8 > "$work/merged.log" 2>&1 \
  || { cat "$work/merged.log"; fail "merge_cost did not run"; }
cat "$work/merged.log"
# How many rows merge depends on scheduling (in the emulated guest a few halves miss each
# other): some must have become full-stripe writes.
grep -q "merging on .*rows planned full [1-9]" "$work/merged.log" || fail "no writes were merged into full stripes"
mloops=()
for i in 0 1 2 3 4 5; do mloops+=("$(losetup -f --show "$work/merged/m$i")"); done
mdadm --create /dev/md/merged --run --assume-clean --metadata=1.2 --level=6 --raid-devices=6 \
    --chunk=64 --layout=left-symmetric --data-offset=1M --bitmap=none "${mloops[@]}" < /dev/null \
    > "$work/mdadm.log" 2>&1 || { cat "$work/mdadm.log"; fail "mdadm --create over the merged pool"; }
mmd=$(readlink -f /dev/md/merged)
head -c $((8 << 20)) "$mmd" | cmp - "$work/merged/expected" || fail "md reads different bytes than were written merged"
mname=$(basename "$mmd")
echo check > /sys/block/$mname/md/sync_action
sleep 1
while [[ $(cat /sys/block/$mname/md/sync_action) != idle ]]; do sleep 1; done
mmm=$(cat /sys/block/$mname/md/mismatch_cnt)
mdadm --stop "$mmd" >/dev/null 2>&1
for l in "${mloops[@]}"; do losetup -d "$l"; done
[[ $mmm == 0 ]] || fail "md's parity check found $mmm mismatched sectors after merged writes"
echo "md-compat: merged writes on raid6: md reads the same bytes, parity check clean"
echo "md-compat: passed"
