# Shared by the peer benchmarks (scripts/bench-nvmf-spdk.sh, scripts/bench-nbd-nbdkit.sh,
# scripts/bench-blockdev.sh): a Millrace server pinned to one core over drive files in /dev/shm
# or over block devices, and the CPU a process used. Sourced, not run.

# cpu_ticks PID: user + system clock ticks of a process, all its threads.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)

# us_per_io TICKS_BEFORE TICKS_AFTER IOS: CPU microseconds per I/O, one decimal.
us_per_io() { awk -v a="$1" -v b="$2" -v n="$3" -v hz="$hz" 'BEGIN { if (n > 0) printf "%.1f", (b - a) * 1e6 / hz / n; else print "-" }'; }

# ratio A B: A / B with two decimals, "-" when B is empty or zero.
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b + 0 > 0) printf "%.2f", a / b; else print "-" }'; }

# pinned_to PID: the CPUs a process may run on.
pinned_to() { taskset -pc "$1" | sed 's/.*: //'; }

# A core of its own: warn when something else ran on CPU C during the last run. busy_other C
# SECONDS PIDS... prints the share of CPU C's time spent by processes other than PIDS.
cpu_stat() { awk -v c="cpu$1" '$1 == c {print $2 + $3 + $4 + $7 + $8, $2 + $3 + $4 + $5 + $6 + $7 + $8}' /proc/stat; }

# start_millrace HOME CPU LEVEL MEMBERS MEMBER_SIZE SERVE_ARGS...: a pool of MEMBERS drive files
# of MEMBER_SIZE in /dev/shm (64 KiB strips), or of the block devices MEMBER_DEVICES names
# (space-separated, MEMBERS of them), one volume `bench/v` over most of it, the server pinned to
# CPU (VOL_SIZE overrides the volume's size). Sets m (the CLI), server (its pid), vol_size.
start_millrace() {
    local home=$1 cpu=$2 level=$3 members=$4 member_size=$5
    shift 5
    m=${MILLRACE_BIN:-$PWD/target/release/millrace}
    export MILLRACE_HOME=$home
    mkdir -p "$home"
    local drives=() create=()
    if [[ -n ${MEMBER_DEVICES:-} ]]; then
        read -ra drives <<<"$MEMBER_DEVICES"
        drives=("${drives[@]:0:$members}")
    else
        for i in $(seq 0 $((members - 1))); do drives+=("/dev/shm/millrace-bench-$$-$i.img"); done
        create=(--create "$member_size")
    fi
    "$m" pool create bench --level "$level" --strip 64k "${create[@]}" "${drives[@]}" >/dev/null
    vol_size=${VOL_SIZE:-}
    [[ -n $vol_size ]] || vol_size=$("$m" pool show bench --json | python3 -c 'import json,sys; p=json.load(sys.stdin); print(p["size_bytes"] * 9 // 10 // (1<<20) * (1<<20))')
    "$m" volume create bench/v --size "$vol_size" >/dev/null
    local cores=()
    "$m" serve --help | grep -q -- '--cores' && cores=(--cores 1)
    taskset -c "$cpu" "$m" serve "${cores[@]}" "$@" >"$home/serve.log" 2>&1 &
    server=$!
    for _ in $(seq 200); do "$m" status >/dev/null 2>&1 && break; sleep 0.1; done
    "$m" status >/dev/null
}

stop_millrace() {
    if [[ -n ${server:-} ]] && kill -0 "$server" 2>/dev/null; then
        kill "$server"
        wait "$server" 2>/dev/null || true
    fi
    server=
    rm -f /dev/shm/millrace-bench-$$-*.img
}

# ctx_switches PID: voluntary + involuntary context switches of all the process's threads so far.
ctx_switches() { cat /proc/"$1"/task/*/status 2>/dev/null | awk '/ctxt_switches/ { s += $2 } END { print s + 0 }'; }

# iowq_workers PID: io_uring worker threads (iou-wrk-*) the process has now: entries the kernel
# could not issue without blocking were punted to them.
iowq_workers() { cat /proc/"$1"/task/*/comm 2>/dev/null | grep -c '^iou-wrk' || true; }
