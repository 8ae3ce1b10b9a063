#!/usr/bin/env bash
# Every test Millrace has: style, lints, the Rust suites, the Python client, and the real Linux
# clients in a guest kernel. Installs what it needs first. Ends with a table of each stage's
# seconds (wall clock and CPU) and "N passed, M failed" (", K skipped" where tests could not run here, listed above
# it: in CI, where CI is set, a Rust test that lacks what it needs fails instead).
#
# Each profile is built once (the test profile is the dev profile), and every later stage runs
# what it made (its folder is MILLRACE_BINS) instead of building its own. Once the binaries and
# examples are built (before the tests, which reuse them) the guest scripts
# (tests/guest/*.sh, in throwaway VMs) start in the background (tests/guest/run-all: in groups
# that share a boot, MILLRACE_GUEST_JOBS guests at a time, 2 by default) while the host suites
# run here; each script's output is printed whole, in order, at the end, and counts as a stage
# of its own (its seconds in the guest, without the boot).
set -uo pipefail
cd "$(dirname "$0")/.."
t_start=$SECONDS
# How busy the cores were over the whole run (guests and host suites share them): the summary's
# last line, so a slower run can be told apart from a busier one.
cpu_ticks() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9, $5 + $6 }' /proc/stat; }
read -r busy0 idle0 <<< "$(cpu_ticks)"
bash scripts/setup.sh || exit 1
# A run from a fresh clone gains nothing from incremental caches, which take about as much disk
# as the build itself; without them a full run from a fresh clone needs about 10 GiB free.
export CARGO_INCREMENTAL=0
free_gib=$(df -Pk . | awk 'NR == 2 { print int($4 / 1048576) }')
if ((free_gib < 10)); then
  echo "warning: only $free_gib GiB free here; a full run from a fresh clone needs about 10 GiB, so steps may fail with 'No space left on device'. Free space (an old target/ folder) first."
fi
work=$(mktemp -d)
# Tests that cannot run here add a line each to this file (the Rust tests' cannot_run outside
# CI, the Python client's skipped tests); the summary counts them.
export MILLRACE_SKIPS=$work/skipped
: > "$MILLRACE_SKIPS"
guest_runner=
cleanup() {
  [[ -n $guest_runner ]] && kill -- -"$guest_runner" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

passed=0 failed=0 failures=() stages=() stage_secs=() stage_cpu=() stage_result=()
record() { # NAME SECONDS RESULT [CPU-SECONDS]
  stages+=("$1"); stage_secs+=("$2"); stage_result+=("$3"); stage_cpu+=("${4:--}")
  if [[ $3 == ok ]]; then
    passed=$((passed + 1)); echo "--- ok: $1 ($2 s)"
  elif [[ $3 == skipped ]]; then
    echo "--- skipped: $1 ($2 s)"
  else
    failed=$((failed + 1)); failures+=("$1"); echo "--- FAILED: $1 ($2 s${3#FAILED})"
  fi
}
# A stage's CPU seconds (user and system, its own and its children's) come from GNU time around
# a bash that runs it (the stages that are shell functions are exported for that): the seconds
# the cores gave it, beside the wall clock that the guests running alongside stretch.
step() {
  local name=$1; shift
  echo "=== $name"
  local t0=$SECONDS ok=0 cpu
  /usr/bin/time -o "$work/cpu" -f '%U %S' bash -c '"$@"' step "$@" && ok=1
  cpu=$(awk 'END { if (NF == 2) printf "%d", $1 + $2 + 0.5; else print "-" }' "$work/cpu" 2>/dev/null)
  if ((ok)); then record "$name" $((SECONDS - t0)) ok "$cpu"; else record "$name" $((SECONDS - t0)) FAILED "$cpu"; fi
}

step "cargo fmt" cargo fmt --all --check
step "layering: no two modules of a crate import each other; crate dependencies as docs/ARCHITECTURE.md" python3 scripts/module-circles.py
step "sizes: no function over 100 lines, no file over 800" python3 scripts/code-sizes.py
# One profile, built in two steps so that the guests (the critical path: emulated CPUs) start as
# soon as what they run exists: first the binaries and examples, then the tests, which reuse
# every artifact of the first step (the test profile is the dev profile) and add only the test
# harnesses; a third command checks that nothing was left to build.
# (The guest nvme-tls-ktls also runs one test binary, crates/millrace-nvmf/tests/tls.rs.)
build_for_guests() {
  cargo build --workspace --bins --examples -q && cargo test --workspace --no-run -q --test tls
}
export -f build_for_guests
step "build: the binaries, examples and the tls test (what the guests run)" bash -c build_for_guests
bins=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/debug
export MILLRACE_BINS=$bins
step "build the CSI driver and csi-sanity for the guest" bash tests/csi/build-for-guest.sh "$bins"

# The guests, in the background from here on: each is a throwaway VM that writes only inside
# itself, so they run side by side and beside the host suites. Each script's output and its exit
# status and seconds land in $work/guests (tests/guest/run-all says how they share guests).
guests=()
for g in tests/guest/*.sh; do [[ -e $g ]] && guests+=("$(basename "$g" .sh)"); done
set -m   # the runner gets a process group of its own, so cleanup can end it and its guests
t_guests=$SECONDS
/usr/bin/time -o "$work/guests.cpu" -f '%e %U %S' tests/guest/run-all "$bins" "$work/guests" < /dev/null > "$work/run-all.out" 2>&1 &
guest_runner=$!
set +m
echo "=== guests: ${#guests[@]} scripts started in the background (tests/guest/run-all; output at the end)"

step "cargo clippy" cargo clippy --workspace --all-targets -q -- -D warnings
# The command a user runs for `pool show` links the service layer, not the server: no HTTP server
# stack, no server-side TLS, no RDMA binding (issue #47; `millrace serve` execs millrace-server).
# rustls stays, as ureq's client TLS for an HTTPS API.
cli_links_no_server() {
  local bad
  bad=$(cargo tree -p millrace-cli -e normal --prefix none | awk '{print $1}' | sort -u |
    grep -xE 'axum|axum-core|axum-server|hyper|hyper-util|tokio-rustls|utoipa-axum|rdma-mummy-sys|millrace-rdma|millrace-nvmf-rdma|millrace-server')
  [[ -z $bad ]] || { echo "millrace-cli links what only the server may:" $bad; return 1; }
}
export -f cli_links_no_server
step "layering: the millrace command links no server, HTTP server stack or RDMA binding (cargo tree)" cli_links_no_server
step "dependencies: none unused (cargo machete)" bash scripts/unused-deps.sh

build_tests() {
  cargo test --workspace --no-run -q && cargo build --workspace --bins --examples -q
}
export -f build_tests
step "build: the tests (the same profile: nothing above is built again)" build_tests
step "cargo test" cargo test --workspace -q
step "api: openapi conformance (schemathesis)" bash tests/api/schemathesis.sh
step "dashboard: headless chromium" bash tests/dashboard/run.sh
step "fuzz: replay the corpora, then nvme/tcp pdu and session, nbd session, api json (short run)" bash scripts/fuzz.sh
step "soak: NVMe/TCP and NBD clients dropping and reconnecting, 45 s" bash tests/soak/run.sh
step "nbd: the stock tools (nbdinfo, qemu-img, nbdsh, nbdcopy), trim, fast zero, kill -9" bash tests/nbd/stock-tools.sh
step "csi: gofmt, go vet, go test, manifests" bash tests/csi/check.sh
step "csi: csi-sanity, identity and controller, two servers" bash tests/csi/sanity.sh
if [[ -f python/pyproject.toml ]]; then
  step "python client" bash python/tests/run.sh
fi

echo "=== waiting for the guests"
t0=$SECONDS
wait "$guest_runner"
guest_runner=
echo "    (waited $((SECONDS - t0)) s for the guests after the host suites)"
grep -E '^run-all: (guest|[0-9]+ scripts)' "$work/run-all.out" | sed 's/^/    /'
for name in "${guests[@]}"; do
  echo "=== guest: $name"
  if [[ -f $work/guests/$name.rc ]]; then
    cat "$work/guests/$name.log" 2>/dev/null
  else
    cat "$work/run-all.out"; echo "scripts/test.sh: tests/guest/run-all gave no result for $name"
  fi
  read -r rc secs 2>/dev/null < "$work/guests/$name.rc" || { rc=1 secs=0; }
  # Exit 77: the script could not run in this guest (it says why after SKIPPED:), e.g.
  # nvme-auth where the guest fell back to a kernel without NVMe authentication. Counted as
  # skipped, or, where CI is set (CI runs everything), as a failure, unless the script says
  # on a `# ci-may-skip:` line why CI cannot have what it needs (a peer no package provides).
  why=$(grep -m1 -o 'SKIPPED: .*' "$work/guests/$name.log" 2>/dev/null | cut -c10-)
  ci_may_skip=$(grep -m1 '^# ci-may-skip:' "tests/guest/$name.sh" 2>/dev/null || true)
  if ((rc == 0)); then record "guest: $name" "$secs" ok
  elif ((rc == 77)) && [[ -z ${CI:-} || -n $ci_may_skip ]]; then
    echo "guest: $name: ${why:-see its output}" >> "$MILLRACE_SKIPS"; record "guest: $name" "$secs" skipped
  elif ((rc == 77)); then record "guest: $name" "$secs" "FAILED, exit 77 (skipped, which CI does not allow: ${why:-see its output})"
  else record "guest: $name" "$secs" "FAILED, exit $rc"; fi
done

echo
total="all (wall clock; the guests ran beside the host suites)"
w=${#total}
for n in "${stages[@]}"; do ((${#n} > w)) && w=${#n}; done
printf '%-*s %7s %7s  %s\n' "$w" stage seconds cpu-s result
for i in "${!stages[@]}"; do
  printf '%-*s %7d %7s  %s\n' "$w" "${stages[$i]}" "${stage_secs[$i]}" "${stage_cpu[$i]}" "${stage_result[$i]%%,*}"
done
printf '%-*s %7d\n' "$w" "$total" $((SECONDS - t_start))
read -r busy1 idle1 <<< "$(cpu_ticks)"
awk -v start="$((t_guests - t_start))" 'NF == 3 { printf "the guests: started at %d s, ran %d s, %d cpu-s (the emulated CPUs)\n", start, $1, $2 + $3 }' "$work/guests.cpu" 2>/dev/null
echo "cores: $(nproc), busy $(( 100 * (busy1 - busy0) / (busy1 - busy0 + idle1 - idle0 + 1) ))% of the run"
skipped=$(sort -u "$MILLRACE_SKIPS" | grep -c .)
if ((skipped)); then
  echo "skipped (could not run here: a Rust test or guest script that needs what this machine lacks fails instead in CI, where CI is set; the Python client's GPU tests skip without PyTorch or a GPU):"
  sort -u "$MILLRACE_SKIPS" | sed 's/^/  /'
fi
((failed)) && printf 'failed: %s\n' "${failures[@]}"
echo "$passed passed, $failed failed$( ((skipped)) && echo ", $skipped skipped")"
((failed == 0))
