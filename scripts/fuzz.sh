#!/usr/bin/env bash
# A short fuzz run of the parsers that read from the network: the NVMe/TCP target's PDU and
# command decoders (pdu_decode) and whole connections (conn_session), FUZZ_SECONDS each (45 by
# default), the NBD server's handshake and requests (nbd_session), NBD_FUZZ_SECONDS (30 by
# default), and the HTTP API's JSON bodies and query strings (api_json), API_FUZZ_SECONDS (30 by
# default). FUZZ_TARGETS picks some of them (e.g. FUZZ_TARGETS=api_json). Needs nightly Rust
# and cargo-fuzz, and installs them if it can. Exits non-zero on a crash and names the input
# that caused it; replay one with `cargo +nightly fuzz run TARGET ARTIFACT` in the target's
# crate (crates/millrace-nvmf, crates/millrace-nbd or crates/millrace-server).
set -uo pipefail
cd "$(dirname "$0")/.."
secs=${FUZZ_SECONDS:-45}
nbd_secs=${NBD_FUZZ_SECONDS:-${FUZZ_SECONDS:-30}}
api_secs=${API_FUZZ_SECONDS:-${FUZZ_SECONDS:-30}}
targets=(${FUZZ_TARGETS:-pdu_decode conn_session nbd_session api_json})

if ! rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  if ! rustup toolchain install nightly --profile minimal; then
    echo "SKIP fuzz: no nightly Rust toolchain and 'rustup toolchain install nightly' failed, and cargo-fuzz needs nightly for its sanitizer flags."
    exit 0
  fi
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked || { echo "could not install cargo-fuzz"; exit 1; }
fi

# Seeds: NVMe/TCP PDUs from the target's own encoder; for the API one valid body of each kind
# the target reads (its first byte picks the kind), so inputs start past JSON's syntax.
if [[ " ${targets[*]} " == *" pdu_decode "* || " ${targets[*]} " == *" conn_session "* ]]; then
  cargo run -q -p millrace-nvmf --example nvmf_fuzz_seeds -- crates/millrace-nvmf/fuzz/corpus || exit 1
fi
api_seeds=(
  '{"name":"p","level":"raid5","strip_bytes":65536,"group":null,"drives":["/d0","/d1","/d2"],"create_size_bytes":1048576,"data_offset_bytes":null,"force":false}'
  '{"name":"v","size_bytes":1073741824,"force":false,"props":{"k8s.io/pvc":"x"}}'
  '{"size_bytes":18446744073709551615}'
  '{"drives":["/dev/sdb","/dev/sdc"],"force":true}'
  '{"pool":"p","volume":"v","name":"p/v","clients":["10.0.0.0/24"],"listen":"127.0.0.1:10809","socket":"/run/x.sock"}'
  '{"pool":"p","volume":"v","nqn":"nqn.2026-11.dev.millrace:p.v","hosts":["nqn.h"],"allow_any_host":false}'
  '{"path":"/dev/sdd","force":false}'
  '{"rate_bytes_per_sec":104857600}'
  '{"old":"/dev/sdb","new":"/dev/sde","force":false,"rate_bytes_per_sec":null}'
  '{"repair":true}'
  '{"pool":"p","volume":"v","size_bytes":1073741824,"clients":["10.0.0.1"],"sync":true,"root_squash":true}'
  '{"sim":"16x400M:2000","level":"raid6","strip_bytes":65536,"group":8,"suite":"all","jobs":[1,4],"iodepth":[1,32],"bs":[4096,1048576],"degraded":[0,1],"seconds":0.5}'
  'offset=4096&length=65536'
)
if [[ " ${targets[*]} " == *" api_json "* ]]; then
  mkdir -p crates/millrace-server/fuzz/corpus/api_json
  for i in "${!api_seeds[@]}"; do
    { printf "\\$(printf %03o "$i")"; printf '%s' "${api_seeds[$i]}"; } \
      > "crates/millrace-server/fuzz/corpus/api_json/seed-$i"
  done
fi

# One target folder for all three fuzz crates: they share most dependencies, so each is built
# once (with the sanitizer flags) rather than once per crate.
fuzz_target_dir=${CARGO_TARGET_DIR:-$PWD/target}/fuzz
status=0
for t in "${targets[@]}"; do
  case $t in
    nbd_*) crate=crates/millrace-nbd; s=$nbd_secs ;;
    api_*) crate=crates/millrace-server; s=$api_secs ;;
    *) crate=crates/millrace-nvmf; s=$secs ;;
  esac
  fuzz=$crate/fuzz
  echo "--- fuzz $t for ${s} s"
  mkdir -p "$fuzz/artifacts/$t" "$fuzz/corpus/$t"
  before=$(ls "$fuzz/artifacts/$t" | wc -l)
  (cd "$crate" && cargo +nightly fuzz run --target-dir "$fuzz_target_dir" "$t" -- \
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
