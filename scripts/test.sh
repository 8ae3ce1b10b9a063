#!/usr/bin/env bash
# Every test Millrace has: style, lints, the Rust suites, the Python client, and the real Linux
# clients in a guest kernel. Installs what it needs first. Ends with "N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
# A run from a fresh clone gains nothing from incremental caches, which take about as much disk
# as the build itself; without them a full run from a fresh clone needs about 10 GiB free.
export CARGO_INCREMENTAL=0
free_gib=$(df -Pk . | awk 'NR == 2 { print int($4 / 1048576) }')
if ((free_gib < 10)); then
  echo "warning: only $free_gib GiB free here; a full run from a fresh clone needs about 10 GiB, so steps may fail with 'No space left on device'. Free space (an old target/ folder) first."
fi

passed=0 failed=0 failures=()
step() {
  local name=$1; shift
  echo "=== $name"
  local t0=$SECONDS
  if "$@"; then
    passed=$((passed + 1)); echo "--- ok: $name ($((SECONDS - t0)) s)"
  else
    failed=$((failed + 1)); failures+=("$name"); echo "--- FAILED: $name ($((SECONDS - t0)) s)"
  fi
}

step "cargo fmt" cargo fmt --all --check
step "cargo clippy" cargo clippy --workspace --all-targets -q -- -D warnings
step "layering: no two modules of a crate import each other; crate dependencies as docs/ARCHITECTURE.md" python3 scripts/module-circles.py
step "sizes: no function over 100 lines, no file over 800" python3 scripts/code-sizes.py
step "dependencies: none unused (cargo machete)" bash scripts/unused-deps.sh
step "cargo test" cargo test --workspace -q
step "api: openapi conformance (schemathesis)" bash tests/api/schemathesis.sh
step "dashboard: headless chromium" bash tests/dashboard/run.sh
step "fuzz: nvme/tcp pdu and session, nbd session, api json (short run)" bash scripts/fuzz.sh
step "soak: NVMe/TCP and NBD clients dropping and reconnecting, 45 s" bash tests/soak/run.sh
step "nbd: the stock tools (nbdinfo, qemu-img, nbdsh, nbdcopy), trim, fast zero, kill -9" bash tests/nbd/stock-tools.sh
step "csi: gofmt, go vet, go test, manifests" bash tests/csi/check.sh
step "csi: csi-sanity, identity and controller, two servers" bash tests/csi/sanity.sh
if [[ -f python/pyproject.toml ]]; then
  step "python client" bash python/tests/run.sh
fi
# The guest runs the binaries built here; each script gets their folder as its first argument.
step "build binaries for the guest" cargo build --workspace --bins --examples -q
bins=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/debug
step "build the CSI driver and csi-sanity for the guest" bash tests/csi/build-for-guest.sh "$bins"
# Each guest is a throwaway VM that writes only inside itself, so they run side by side
# (MILLRACE_GUEST_JOBS at a time, 2 by default: one per core here); each one's output is printed
# whole, in order, once it ends.
guest_logs=$(mktemp -d)
guest_jobs=${MILLRACE_GUEST_JOBS:-2}
guests=()
for g in tests/guest/*.sh; do
  [[ -e $g ]] || continue
  guests+=("$g")
  while (($(jobs -rp | wc -l) >= guest_jobs)); do wait -n || true; done
  name=$(basename "$g" .sh)
  ( t0=$SECONDS
    tests/guest/run-in-guest --timeout 1200 "$g" "$bins" > "$guest_logs/$name.log" 2>&1
    echo "$? $((SECONDS - t0))" > "$guest_logs/$name.rc" ) &
done
wait
for g in "${guests[@]}"; do
  name=$(basename "$g" .sh)
  echo "=== guest: $name"
  cat "$guest_logs/$name.log"
  read -r rc secs < "$guest_logs/$name.rc" || { rc=1 secs=0; }
  if ((rc == 0)); then
    passed=$((passed + 1)); echo "--- ok: guest: $name ($secs s)"
  else
    failed=$((failed + 1)); failures+=("guest: $name"); echo "--- FAILED: guest: $name ($secs s, exit $rc)"
  fi
done
rm -rf "$guest_logs"

echo
((failed)) && printf 'failed: %s\n' "${failures[@]}"
echo "$passed passed, $failed failed"
((failed == 0))
