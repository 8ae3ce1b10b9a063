#!/usr/bin/env bash
# Runs inside the guest (tests/guest/run-in-guest). Linux md reads a pool after OUR partial-parity
# log recovery (issue #21): a degraded RAID6 (one member failed) takes writes from four threads
# of a process that kills itself mid-write (examples/crash_writer: SIGKILL, no clean stop);
# millrace opens the pool again, which recovers the stripes being written from its
# partial-parity log; then md assembles the same drive files, with the failed member as
# "missing", reads the same bytes as millrace, and md's own parity check of the degraded array
# (it rebuilds the missing strip from P and checks Q against it) finds no mismatch. md's PPL
# format is not ours and plays no part: the point is that after our recovery md finds a
# consistent array. A control then damages one strip behind md's back and the same check must
# see it, so the clean result is not a check that never ran.
set -euo pipefail
# The guest gets no environment: the folder of built binaries comes as the first argument.
B=${1:-$PWD/target/debug}
M=$B/millrace
X=$B/examples/crash_writer
for f in "$M" "$X"; do
  [[ -x $f ]] || { echo "md-ppl: $f is missing; build it first (cargo build --workspace --bins --examples)"; exit 1; }
done
modprobe -a raid456 loop
work=$(mktemp -d /tmp/mdppl.XXXXXX)
export MILLRACE_HOME=$work/home
fail() { echo "md-ppl: FAILED: $*"; exit 1; }

md_check() {
  local name=$1
  echo check > /sys/block/$name/md/sync_action
  sleep 1
  while [[ $(cat /sys/block/$name/md/sync_action) != idle ]]; do sleep 1; done
  cat /sys/block/$name/md/mismatch_cnt
}

round() {
  local seed=$1 writes=$2 out=3 n=6
  local d=("$work"/s$seed-d{0..5}.img)
  $M pool create c$seed --level raid6 --strip 64k --create 24M --data-offset 1M "${d[@]}" >/dev/null
  local size; size=$($M pool show c$seed --json | sed -n 's/.*"size_bytes": \([0-9]*\).*/\1/p')
  head -c "$size" /dev/urandom | $M io write c$seed --offset 0
  $M pool fail c$seed "${d[$out]}" >/dev/null
  local rc=0
  "$X" "$seed" "$writes" "${d[@]}" > "$work/writer.log" 2>&1 || rc=$?
  cat "$work/writer.log"
  [[ $rc == 137 ]] || fail "crash_writer should have killed itself (exit 137), it exited $rc"
  # Opening the pool again recovers it: the crash is noticed and the log applied.
  MILLRACE_LOG=warn $M io read c$seed --offset 0 --length "$size" --output "$work/ours" 2> "$work/open.log" \
    || { cat "$work/open.log"; fail "millrace could not read the pool after the crash"; }
  cat "$work/open.log"
  grep -q "not shut down cleanly" "$work/open.log" || fail "the pool did not notice the crash"
  grep -q "from the partial-parity log" "$work/open.log" || fail "no stripe update was recovered from the partial-parity log"
  # A second read (the pool is clean now) gives the same bytes.
  $M io read c$seed --offset 0 --length "$size" | cmp - "$work/ours" || fail "the pool reads differently after its recovery"

  local loops=() l
  for i in $(seq 0 $((n - 1))); do
    if [[ $i == "$out" ]]; then loops+=(missing); else loops+=("$(losetup -f --show "${d[$i]}")"); fi
  done
  mdadm --create /dev/md/c$seed --run --assume-clean --metadata=1.2 --level=6 --raid-devices=$n \
      --chunk=64 --layout=left-symmetric --data-offset=1M --bitmap=none "${loops[@]}" < /dev/null \
      > "$work/mdadm.log" 2>&1 || { cat "$work/mdadm.log"; fail "mdadm --create over the recovered pool"; }
  local md; md=$(readlink -f /dev/md/c$seed)
  local name; name=$(basename "$md")
  grep -q "\[$n/$((n - 1))\]" /proc/mdstat || { cat /proc/mdstat; fail "md did not assemble the degraded array"; }
  head -c "$size" "$md" | cmp - "$work/ours" || fail "md reads different bytes than millrace after the recovery"
  local mm; mm=$(md_check "$name")
  # The control: one strip of a live member damaged behind md's back.
  dd if=/dev/urandom of="${loops[1]}" bs=64k count=1 seek=$((1024 / 64 + 5)) conv=notrunc,fsync status=none
  echo 3 > /proc/sys/vm/drop_caches
  local bad; bad=$(md_check "$name")
  mdadm --stop "$md" >/dev/null 2>&1
  for l in "${loops[@]}"; do [[ $l == missing ]] || losetup -d "$l"; done
  [[ $mm == 0 ]] || fail "md's parity check found $mm mismatched sectors in the recovered pool"
  [[ $bad -gt 0 ]] || fail "md's parity check of the degraded array did not notice a damaged strip, so its clean result proves nothing"
  echo "md-ppl: seed $seed: killed after $writes writes, recovered by millrace; md (degraded) reads the same $size bytes, parity check clean (control: $bad)"
}

round 1 40
echo "md-ppl: passed"
