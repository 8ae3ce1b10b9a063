#!/usr/bin/env bash
# Per-I/O costs of the array's synchronous and async (per-core io_uring) faces that do not depend
# on machine load: instructions (callgrind, all threads, the difference between two run lengths
# divided by the extra requests, so set-up cancels out), heap allocations, minor page faults and
# io_uring_enter calls per request. Members are files in /dev/shm (DIR= to change).
# Usage: scripts/datapath-cost.sh [LEVELS] [SIZES]   e.g. scripts/datapath-cost.sh "raid0 raid6" "4096 131072"
set -euo pipefail
cd "$(dirname "$0")/.."
levels=${1:-"raid0 raid6"}
sizes=${2:-"4096 131072"}
short=${SHORT:-200}
long=${LONG:-1200}
cargo build --release -q -p millrace-array --example datapath_cost
bin=target/release/examples/datapath_cost
if ! command -v valgrind >/dev/null; then
    echo "valgrind is not installed (apt-get install valgrind): instruction counts are skipped" >&2
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ir() { # mode level size ops -> total instructions
    valgrind --tool=callgrind --callgrind-out-file="$tmp/cg" "$bin" "$@" >/dev/null 2>"$tmp/err"
    awk '/^summary:/ {print $2}' "$tmp/cg"
}
printf '%-12s %-6s %8s %14s %s\n' mode level size "instr/IO" "allocations, faults, enters per I/O"
for level in $levels; do
    for size in $sizes; do
        for mode in sync-read async-read sync-write async-write; do
            line=$("$bin" "$mode" "$level" "$size" "$long")
            per="-"
            if command -v valgrind >/dev/null; then
                a=$(ir "$mode" "$level" "$size" "$short")
                b=$(ir "$mode" "$level" "$size" "$long")
                per=$(( (b - a) / (long - short) ))
            fi
            printf '%-12s %-6s %8s %14s %s\n' "$mode" "$level" "$size" "$per" \
                "$(echo "$line" | sed 's/^[^:]*: //; s/ per I\/O (.*//')"
        done
    done
done
