#!/usr/bin/env bash
# NVMe/TCP: Millrace's target against SPDK's nvmf_tgt (issue #15), the same initiator for both
# (SPDK's spdk_nvme_perf), each target pinned to CPU 0 and the initiator to CPU 1, over loopback.
# Millrace serves a RAID0 volume over 4 drive files in /dev/shm (64 KiB strips); SPDK serves a
# RAID0 bdev over 4 malloc bdevs of the same size (64 KiB strips), and again over 4 AIO bdevs on
# files in /dev/shm: the same kind of member as Millrace's, whose writes cost the kernel's
# page-cache write where a malloc bdev's are a copy (PEERS=malloc or PEERS=files runs one).
# Rows: 4K random read and write at QD64, 128K sequential read and write at QD16; then Millrace's
# RAID6 over 6 members against RAID0 over the same 6 for 128K sequential writes. Each row: IOPS,
# the ratios, and the targets' CPU microseconds per I/O (SPDK's reactor polls: its core is busy
# all the run, so its CPU per I/O is the run's length over its I/Os).
#
# SPDK is not packaged and this project does not build it: point SPDK_DIR at a built SPDK v24.01
# tree (build/bin/nvmf_tgt, build/bin/spdk_nvme_perf, scripts/rpc.py). Without it this script says
# so and stops: the initiator is SPDK's too, so there is nothing to compare without it.
# Timing: run it on a quiet machine (nothing else compiling), as root (SPDK without hugepages).
# ROUNDS=N runs every target N times, taking turns round by round (Millrace, then each SPDK
# peer, each started afresh), and keeps the best round of each target for each row (every round
# is printed): this machine has slow spells that last minutes, and taking turns lets them fall on
# both sides. RAID6 and RAID0 take turns the same way. Beside each best-against-best ratio the
# table gives the median of the rounds' own ratios (each round's two targets ran minutes apart).
# Usage: SPDK_DIR=/path/to/spdk [ROUNDS=N] scripts/bench-nvmf-spdk.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
rounds=${ROUNDS:-1}
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "ROUNDS is '$rounds': give the number of rounds a row runs, 1 or more (ROUNDS=3)." >&2; exit 1; }
member_mib=${MEMBER_MIB:-512}
spdk=${SPDK_DIR:-}
peers=${PEERS:-malloc files}
for kind in $peers; do
    case $kind in malloc | files) ;; *) echo "PEERS lists '$kind': the peers are malloc and files (PEERS=\"malloc files\" runs both)." >&2; exit 1 ;; esac
done
if [[ -z $spdk || ! -x $spdk/build/bin/nvmf_tgt || ! -x $spdk/build/bin/spdk_nvme_perf ]]; then
    echo "SPDK is not here: set SPDK_DIR to a built SPDK v24.01 tree (with build/bin/nvmf_tgt and" >&2
    echo "build/bin/spdk_nvme_perf). It is the peer and the common initiator, so this benchmark is skipped." >&2
    exit 0
fi
source scripts/bench-lib.sh
[[ -n ${MILLRACE_BIN:-} ]] || cargo build --release -q -p millrace-cli -p millrace-server
perf=$spdk/build/bin/spdk_nvme_perf
host=nqn.2014-08.org.nvmexpress:uuid:6d696c6c-7261-6365-0000-62656e636830
nqn=nqn.2026-11.dev.millrace:bench.v
tmp=$(mktemp -d)
tgt=
cleanup() {
    stop_millrace
    [[ -n $tgt ]] && kill "$tgt" 2>/dev/null && wait "$tgt" 2>/dev/null
    rm -f /dev/shm/millrace-bench-$$-spdk-*.img
    rm -rf "$tmp"
}
trap cleanup EXIT

# run_perf PORT NQN WORKLOAD SIZE QD SECONDS: prints "IOPS"
run_perf() {
    local out
    out=$(taskset -c 1 "$perf" --no-huge -s 1024 -c 0x2 -q "$5" -o "$4" -w "$3" -t "$6" \
        -r "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:$1 subnqn:$2 hostnqn:$host" 2>&1) || {
        echo "$out" >&2
        return 1
    }
    echo "$out" | awk '/^Total/ { for (i = 1; i <= NF; i++) if ($i == ":") { print $(i + 1); exit } }'
}

rows=("randread 4096 64" "randwrite 4096 64" "read 131072 16" "write 131072 16")
# keyed by "SIDE ROW"; sides: mr (Millrace), malloc and files (SPDK over either kind of member)
declare -A iops_of cpu_of round_iops

# median VALUES...: the middle value (the mean of the two middle ones for an even count)
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.2f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# paired A B ROW: the median over rounds of side A's IOPS over side B's in the same round, the
# figure a slow spell moves least (the two ran minutes apart, not a whole run apart)
paired() {
    local k rs=()
    for ((k = 1; k <= rounds; k++)); do
        [[ -n ${round_iops[$1 $3 $k]:-} && -n ${round_iops[$2 $3 $k]:-} ]] &&
            rs+=("$(ratio "${round_iops[$1 $3 $k]}" "${round_iops[$2 $3 $k]}")")
    done
    ((${#rs[@]})) && median "${rs[@]}" || echo "-"
}

# beats IOPS BEST: whether a round's IOPS beat the best so far (none yet: any round does). The
# best round stands for the row: this machine has slow spells that hit either target for a
# whole run (docs/PERFORMANCE.md).
beats() { [[ -z $2 ]] || awk -v a="$1" -v b="$2" 'BEGIN { exit !(a > b) }'; }

# one round of one side: PORT NQN PID SIDE ROUND (fills iops_of and cpu_of under "SIDE ROW")
measure() {
    local port=$1 nqn=$2 pid=$3 side=$4 k=$5
    local pass=$(( member_mib * 4 / 400 + 3 )) # seconds to go over the volume once
    run_perf "$port" "$nqn" write 1048576 8 "$pass" >/dev/null # fill
    # ... and read once: Millrace reads member files in memory through a mapping whose page
    # table fills as pages are first touched (a write by pwrite, when a member's redo slots are
    # all in use, leaves it empty); SPDK's malloc bdevs start filled, and its AIO bdevs read by
    # pread.
    run_perf "$port" "$nqn" read 1048576 8 "$pass" >/dev/null
    for row in "${rows[@]}"; do
        read -r w bs qd <<<"$row"
        run_perf "$port" "$nqn" "$w" "$bs" "$qd" 2 >/dev/null # warm
        local t0 t1 c0 c1 iops cpu
        t0=$(cpu_ticks "$pid"); c0=$(cpu_stat 0)
        iops=$(run_perf "$port" "$nqn" "$w" "$bs" "$qd" "$secs")
        c1=$(cpu_stat 0); t1=$(cpu_ticks "$pid")
        local ios; ios=$(awk -v r="$iops" -v s="$secs" 'BEGIN { printf "%d", r * s }')
        if [[ $side == mr ]]; then
            cpu=$(us_per_io "$t0" "$t1" "$ios")
        else
            cpu=$(awk -v s="$secs" -v n="$ios" 'BEGIN { printf "%.1f", s * 1e6 / n }')
        fi
        read -r b0 a0 <<<"$c0"; read -r b1 a1 <<<"$c1"
        # Did the target have CPU 0 to itself? Its own share of the core, and what else ran there.
        local share
        share=$(awk -v b=$((b1 - b0)) -v a=$((a1 - a0)) -v t=$((t1 - t0)) \
            'BEGIN { o = 100 * (b - t) / a; if (o < 0) o = 0; printf "target %.0f%% of CPU 0, others %.0f%%", 100 * t / a, o }')
        echo "  $side $row (round $k): $iops IOPS, $cpu us/I/O; $share" >&2
        round_iops[$side $row $k]=$iops
        case $share in
            *"others "[0-4]%)
                if beats "$iops" "${iops_of[$side $row]:-}"; then
                    iops_of[$side $row]=$iops
                    cpu_of[$side $row]=$cpu
                fi
                ;;
            *)
                echo "  WARNING: CPU 0 was shared with other work; this round counts only if none is clean" >&2
                if [[ $k == "$rounds" && -z ${iops_of[$side $row]:-} ]]; then
                    iops_of[$side $row]=$iops
                    cpu_of[$side $row]=$cpu
                fi
                ;;
        esac
    done
}

# Millrace (RAID0, 4 members in /dev/shm), started afresh for the round
measure_millrace() {
    echo "Millrace (RAID0, 4 x ${member_mib} MiB in /dev/shm), target on CPU 0, initiator on CPU 1 (round $1)" >&2
    start_millrace "$tmp/home-$1" 0 raid0 4 "${member_mib}M" --nvme 127.0.0.1:4420 --discovery-port 8019 --api 127.0.0.1:8749
    "$m" export nvme add bench/v --host "$host" >/dev/null
    echo "  server pinned to CPUs $(pinned_to "$server")" >&2
    measure 4420 "$nqn" "$server" mr "$1"
    stop_millrace
}

# measure_spdk KIND ROUND: SPDK's nvmf_tgt over a RAID0 bdev of 4 members of KIND (malloc: RAM
# bdevs; files: AIO bdevs on drive files in /dev/shm, as Millrace's), reactor on CPU 0.
measure_spdk() {
    local kind=$1 sock=$tmp/spdk.sock members=() i
    echo "SPDK nvmf_tgt (RAID0 bdev over 4 x ${member_mib} MiB $kind members), reactor on CPU 0 (round $2)" >&2
    local mem=1024
    [[ $kind == malloc ]] && mem=$(( member_mib * 4 + 1024 ))
    rm -f "$sock"
    "$spdk/build/bin/nvmf_tgt" -m 0x1 --no-huge -s "$mem" -r "$sock" >"$tmp/tgt.log" 2>&1 &
    tgt=$!
    rpc() { "$spdk/scripts/rpc.py" -s "$sock" "$@" >/dev/null; }
    for _ in $(seq 100); do [[ -S $sock ]] && break; sleep 0.2; done
    rpc nvmf_create_transport -t TCP
    for i in 0 1 2 3; do
        if [[ $kind == malloc ]]; then
            rpc bdev_malloc_create -b "m$i" "$member_mib" 4096
        else
            local f=/dev/shm/millrace-bench-$$-spdk-$i.img
            truncate -s "${member_mib}M" "$f"
            rpc bdev_aio_create "$f" "m$i" 4096
        fi
        members+=("m$i")
    done
    rpc bdev_raid_create -n r0 -z 64 -r 0 -b "${members[*]}"
    local spdk_nqn=nqn.2016-06.io.spdk:bench
    rpc nvmf_create_subsystem "$spdk_nqn" -s SPDK0001
    rpc nvmf_subsystem_add_host "$spdk_nqn" "$host"
    rpc nvmf_subsystem_add_ns "$spdk_nqn" r0
    rpc nvmf_subsystem_add_listener "$spdk_nqn" -t tcp -f ipv4 -a 127.0.0.1 -s 4421
    echo "  nvmf_tgt pinned to CPUs $(pinned_to "$tgt")" >&2
    measure 4421 "$spdk_nqn" "$tgt" "$kind" "$2"
    kill "$tgt"; wait "$tgt" 2>/dev/null || true; tgt=
    rm -f /dev/shm/millrace-bench-$$-spdk-*.img
}

# The targets take turns, round by round, each started afresh on fresh members: this machine's
# slow spells last minutes, and with every round of one target run in a row a spell fell on one
# side only (ratios moved by up to 39% between runs). Each row keeps the best round of each side.
for ((k = 1; k <= rounds; k++)); do
    measure_millrace "$k"
    for kind in $peers; do measure_spdk "$kind" "$k"; done
done

echo "Millrace RAID6 against RAID0 over the same 6 members, 128K sequential writes at QD16" >&2
# member_bytes read|write: bytes the members moved so far, all members together (the server's metrics)
member_bytes() { curl -s 127.0.0.1:8749/metrics | awk -v op="$1" '$1 ~ "^millrace_member_" op "_bytes_total" { s += $2 } END { printf "%.0f", s }'; }
declare -A six six_cpu
# per_byte BEFORE AFTER: member bytes per byte the host wrote in the round just run ($iops). 1.5
# written and none read is every stripe written whole (4 data members and 2 parity); reads are
# read-modify-writes of stripes written in pieces.
per_byte() { awk -v a="$1" -v b="$2" -v n="$iops" -v s="$secs" 'BEGIN { printf "%.2f", (b - a) / (n * s * 131072) }'; }
# The levels take turns, round by round, each on a fresh pool (filled first), so that a slow
# spell of this machine falls on both rather than on one level's rounds.
for ((k = 1; k <= rounds; k++)); do
    for level in raid0 raid6; do
        start_millrace "$tmp/home-$level-$k" 0 "$level" 6 "${member_mib}M" --nvme 127.0.0.1:4420 --discovery-port 8019 --api 127.0.0.1:8749
        "$m" export nvme add bench/v --host "$host" >/dev/null
        run_perf 4420 "$nqn" write 1048576 8 "$(( member_mib * 6 / 400 + 3 ))" >/dev/null
        r0=$(member_bytes read); w0=$(member_bytes write); t0=$(cpu_ticks "$server")
        iops=$(run_perf 4420 "$nqn" write 131072 16 "$secs")
        t1=$(cpu_ticks "$server"); r1=$(member_bytes read); w1=$(member_bytes write)
        cpu=$(us_per_io "$t0" "$t1" "$(awk -v r="$iops" -v s="$secs" 'BEGIN { printf "%d", r * s }')")
        echo "  $level (round $k): $iops IOPS, $cpu us/I/O; members wrote $(per_byte "$w0" "$w1") and read $(per_byte "$r0" "$r1") bytes per byte written" >&2
        round_iops[$level six $k]=$iops
        if beats "$iops" "${six[$level]:-}"; then
            six[$level]=$iops
            six_cpu[$level]=$cpu
        fi
        stop_millrace
    done
done

echo
head="| workload | queue depth | Millrace IOPS"
line="|---|---|---"
for kind in $peers; do head+=" | SPDK ($kind) IOPS | ratio | round by round"; line+="|---|---|---"; done
head+=" | target CPU us/I/O Millrace"; line+="|---"
for kind in $peers; do head+=" | SPDK ($kind)"; line+="|---"; done
echo "$head |"
echo "$line|"
for row in "${rows[@]}"; do
    read -r w bs qd <<<"$row"
    out="| $w $((bs / 1024))K | $qd | ${iops_of[mr $row]}"
    for kind in $peers; do out+=" | ${iops_of[$kind $row]} | $(ratio "${iops_of[mr $row]}" "${iops_of[$kind $row]}") | $(paired mr "$kind" "$row")"; done
    out+=" | ${cpu_of[mr $row]}"
    for kind in $peers; do out+=" | ${cpu_of[$kind $row]}"; done
    echo "$out |"
done
echo
echo "RAID6 / RAID0, 6 members, 128K sequential write QD16: ${six[raid6]} / ${six[raid0]} IOPS = $(ratio "${six[raid6]}" "${six[raid0]}"), round by round $(paired raid6 raid0 six) (target CPU ${six_cpu[raid6]} / ${six_cpu[raid0]} us per I/O)"
echo "(ratio: best round against best round; round by round: the median of each round's ratio)"
