#!/usr/bin/env bash
# The main job on the embedded default: a RAID6 pool of eight drive files under ./millrace-data,
# data written at an unaligned offset and verified, then `pool show`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --release -q -p millrace-cli
export MILLRACE_HOME=${MILLRACE_HOME:-$PWD/millrace-data}
m=target/release/millrace
drives=$MILLRACE_HOME/drives

if $m pool show demo >/dev/null 2>&1; then
  $m pool destroy demo --yes
fi
rm -f "$drives"/d{0..7}.img
$m pool create demo --level raid6 --strip 64k --create 2G "$drives"/d{0..7}.img >/dev/null

data=$(mktemp); back=$(mktemp); trap 'rm -f "$data" "$back"' EXIT
head -c $((256 << 20)) /dev/urandom > "$data"
echo "writing 256 MiB at offset 12345..."
$m io write demo --offset 12345 --input "$data"
$m io read demo --offset 12345 --length $((256 << 20)) --output "$back"
if cmp -s "$data" "$back"; then
  echo "verified: the 256 MiB read back equal what was written"
else
  echo "FAILED: the data read back differs" >&2; exit 1
fi
$m pool show demo
