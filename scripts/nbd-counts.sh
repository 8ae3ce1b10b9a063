#!/usr/bin/env bash
# Load-independent costs of an NBD server per request (issue #15): page faults, context switches
# and system calls of the server process for a fixed fio workload (fio's nbd engine, one
# connection), so that two builds (or Millrace and nbdkit) can be compared on a busy machine.
# No timing is reported: counts only.
#
#   scripts/nbd-counts.sh [SERVER_KIND] [SERVER_BINARY] [EXTRA_ARGS...]
#     SERVER_KIND: millrace (default; SERVER_BINARY is an nbd_serve example binary, by default
#     target/debug/examples/nbd_serve) or nbdkit (nbdkit's file plugin).
#
# Faults are the process's minor+major faults (/proc/PID/stat, all threads, living or not);
# context switches are the sum over its threads (/proc/PID/task/*/status) after a warm-up run
# (so that worker threads exist and are counted); syscalls come from a second pass of the same
# workload under `strace -c -f -p PID` (strace slows the server; its counts do not change).
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:-millrace}
bin=${2:-target/debug/examples/nbd_serve}
shift $(($# > 2 ? 2 : $#)) || true
extra=("$@")
tmp=$(mktemp -d /dev/shm/nbd-counts.XXXXXX)
pid=
cleanup() { [[ -n $pid ]] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
sock=$tmp/s.sock
truncate -s 256M "$tmp/disk.img"
case $kind in
  millrace)
    "$bin" --file "$tmp/disk.img" --unix "$sock" "${extra[@]}" >"$tmp/log" 2>&1 &
    pid=$!
    uri="nbd+unix:///vol?socket=$sock" ;;
  nbdkit)
    nbdkit -f -U "$sock" file "$tmp/disk.img" "${extra[@]}" >"$tmp/log" 2>&1 &
    pid=$!
    uri="nbd+unix:///?socket=$sock" ;;
  *) echo "usage: $0 [millrace|nbdkit] [BINARY] [EXTRA_ARGS...]" >&2; exit 2 ;;
esac
for _ in $(seq 100); do [[ -S $sock ]] && break; sleep 0.1; done
[[ -S $sock ]] || { echo "the server did not start:"; cat "$tmp/log"; exit 1; }

run_fio() { # rw bs iodepth size
  fio --name=c --ioengine=nbd --uri="$uri" --rw="$1" --bs="$2" --iodepth="$3" --size="$4" \
    --output-format=terse >/dev/null
}
faults() { awk '{print $10 + $12}' "/proc/$pid/stat"; }
switches() {
  cat /proc/"$pid"/task/*/status 2>/dev/null |
    awk '/^(non)?voluntary_ctxt_switches/ {n += $2} END {print n}'
}
requests() { # size bs -> count
  echo $(( $(numfmt --from=iec "$1") / $(numfmt --from=iec "$2") ))
}

run_fio write 1M 8 256M # warm-up: every page of the file and every worker thread exists
echo "server: $kind $bin ${extra[*]}"
printf '%-22s %10s %14s %14s %14s\n' workload requests faults/req switches/req syscalls/req
for wl in "randread 4K 32 64M" "randwrite 4K 32 64M" "read 1M 8 256M" "write 1M 8 256M"; do
  set -- $wl
  n=$(requests "$4" "$2")
  f0=$(faults) s0=$(switches)
  run_fio "$@"
  f1=$(faults) s1=$(switches)
  strace -c -f -q -p "$pid" -o "$tmp/strace" &
  st=$!
  sleep 1
  run_fio "$@"
  kill -INT "$st"
  wait "$st" 2>/dev/null || true
  calls=$(awk '/^-+ -+/ {t = 1; next} t && /total/ {print $4; exit}' "$tmp/strace")
  top=$(awk 'f && /^-/ {exit} f {print $NF ":" $4} /^-+ -+/ {f = 1}' "$tmp/strace" |
    sort -t: -k2 -nr | head -n 4 | tr '\n' ' ')
  printf '%-22s %10d %14.2f %14.2f %14.2f   %s\n' "$1 $2 qd$3" "$n" \
    "$(echo "($f1 - $f0) / $n" | bc -l)" "$(echo "($s1 - $s0) / $n" | bc -l)" \
    "$(echo "${calls:-0} / $n" | bc -l)" "$top"
done
