#!/usr/bin/env bash
# A short fuzz run of the parsers that read from the network: the NVMe/TCP target's PDU and
# command decoders (pdu_decode) and whole connections (conn_session), FUZZ_SECONDS each (45 by
# default), and the NBD server's handshake and requests (nbd_session), NBD_FUZZ_SECONDS (30 by
# default). Needs nightly Rust and cargo-fuzz, and installs them if it can. Exits non-zero on a
# crash and names the input that caused it; replay one with `cargo +nightly fuzz run TARGET
# ARTIFACT` in the target's crate (crates/millrace-nvmf or crates/millrace-nbd).
set -uo pipefail
cd "$(dirname "$0")/.."
secs=${FUZZ_SECONDS:-45}
nbd_secs=${NBD_FUZZ_SECONDS:-${FUZZ_SECONDS:-30}}
targets=(${FUZZ_TARGETS:-pdu_decode conn_session nbd_session})

if ! rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  if ! rustup toolchain install nightly --profile minimal; then
    echo "SKIP fuzz: no nightly Rust toolchain and 'rustup toolchain install nightly' failed, and cargo-fuzz needs nightly for its sanitizer flags."
    exit 0
  fi
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked || { echo "could not install cargo-fuzz"; exit 1; }
fi

cargo run -q -p millrace-nvmf --example nvmf_fuzz_seeds -- crates/millrace-nvmf/fuzz/corpus || exit 1

status=0
for t in "${targets[@]}"; do
  case $t in
    nbd_*) crate=crates/millrace-nbd; s=$nbd_secs ;;
    *) crate=crates/millrace-nvmf; s=$secs ;;
  esac
  fuzz=$crate/fuzz
  echo "--- fuzz $t for ${s} s"
  mkdir -p "$fuzz/artifacts/$t" "$fuzz/corpus/$t"
  before=$(ls "$fuzz/artifacts/$t" | wc -l)
  (cd "$crate" && cargo +nightly fuzz run "$t" -- \
      -max_total_time="$s" -rss_limit_mb=2048 -timeout=30 -print_final_stats=1 2>&1) \
    | grep -v '^#[0-9]*.*\(NEW\|REDUCE\|pulse\)' | tail -n 60
  rc=${PIPESTATUS[0]}
  after=$(ls "$fuzz/artifacts/$t" | wc -l)
  if ((rc != 0 || after > before)); then
    status=1
    echo "FUZZ FAILURE in $t (exit $rc); inputs that crashed it:"
    ls -t "$fuzz/artifacts/$t" | head -n 5 | sed "s|^|  $fuzz/artifacts/$t/|"
  fi
done
exit $status
