#!/usr/bin/env bash
# Installs what Millrace's build, demo and tests need, skipping what is already there.
# Debian packages (as root, or with sudo), the Rust components, and the Python test tools.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PKGS=(
  libisal2        # ISA-L: the reference the parity kernels are checked and benchmarked against
  fio             # the raw-drive peer in benchmarks, and fio --ioengine=nbd in tests
  libnbd-bin      # nbdinfo / nbdcopy: real NBD clients
  python3-libnbd  # nbdsh: fast zero and block status by hand (tests/nbd/stock-tools.sh)
  qemu-utils      # qemu-img map / convert against the NBD export (tests/nbd/stock-tools.sh)
  nbdkit          # the NBD peer in benchmarks
  nbd-client      # the kernel NBD client (guest tests)
  nvme-cli        # the NVMe/TCP client (guest tests)
  xfsprogs        # mkfs.xfs (guest tests)
  mdadm           # Linux md, to prove our RAID5/6 layout is md's (guest tests)
  chromium        # the dashboard test (headless, driven by playwright-core)
  nfs-kernel-server rpcbind nfs-common   # shares: the kernel NFS server and client (guest tests)
  qemu-system-x86 linux-image-amd64 busybox-static cpio   # the guest runner
  cmake libclang-dev   # build: rdma-mummy-sys compiles its dlopen shim (cmake) and binds it (bindgen)
  rdma-core ibverbs-providers libibverbs1 librdmacm1   # RDMA at run time (loaded only when used)
  ibverbs-utils rdmacm-utils perftest   # ibv_devices, rping, ib_*_bw: the soft-RoCE checks and peers
  iproute2        # ip and rdma: the veth pair and the soft-RoCE link in the RDMA guest tests
  e2fsprogs util-linux   # the CSI driver's tests (csi/): mkfs.ext4, dumpe2fs and blkid
  gawk            # blktests' check (tests/conformance/run-blktests.sh)
  time            # GNU time: each stage's CPU seconds in scripts/test.sh's table
)
missing=()
for p in "${APT_PKGS[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO=sudo
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# The guests' kernel, Linux 6.12 from bookworm-backports (Debian 12's own 6.1 has no NVMe in-band
# authentication, which tests/guest/nvme-auth.sh needs): installed here once rather than by the
# first guest; where it cannot be had, the guests run the newest kernel in /boot and that script
# reports itself skipped.
$SUDO env MILLRACE_GUEST_KERNEL="${MILLRACE_GUEST_KERNEL:-6.12}" tests/guest/run-in-guest --kernel >/dev/null

if ! command -v cargo >/dev/null; then
  echo "setup: Rust is missing: install it with rustup (https://rustup.rs), then run this again" >&2
  exit 1
fi
rustup component add clippy rustfmt >/dev/null 2>&1 || true
# The tools the suites run, installed once per machine (cargo install compiles them: never on
# every run). Nightly is for cargo-fuzz's sanitizer flags (scripts/fuzz.sh).
need() { echo "setup: $1" >&2; exit 1; }
rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal ||
  need "could not install the nightly Rust toolchain (rustup toolchain install nightly), which the fuzz stage needs"
cargo fuzz --version >/dev/null 2>&1 || cargo install cargo-fuzz --locked ||
  need "could not install cargo-fuzz (cargo install cargo-fuzz --locked), which the fuzz stage needs"
cargo machete --version >/dev/null 2>&1 || cargo install cargo-machete --locked ||
  need "could not install cargo-machete (cargo install cargo-machete --locked), which the unused-dependencies stage needs"
command -v schemathesis >/dev/null ||
  python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore schemathesis ||
  need "could not install schemathesis (pip), which the API conformance stage needs"
[[ -d tests/dashboard/node_modules/playwright-core ]] ||
  (cd tests/dashboard && npm install --no-audit --no-fund --loglevel=error) ||
  need "could not install playwright-core (npm, tests/dashboard), which the dashboard stage needs"

# The CSI driver's Go modules (csi-sanity is pinned as a tool in csi/go.mod) and the schema
# checker for its manifests.
if ! command -v go >/dev/null; then
  echo "setup: Go is missing: install Go 1.25 or newer (https://go.dev/doc/install), then run this again" >&2
  exit 1
fi
(cd csi && go mod download)
command -v kubernetes-validate >/dev/null ||
  python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore kubernetes-validate
