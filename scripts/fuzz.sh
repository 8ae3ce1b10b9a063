#!/usr/bin/env bash
# Fuzzing of the parsers that read from the network, all targets in one cargo-fuzz workspace
# (fuzz/, one Cargo.lock, one sanitizer build): the NVMe/TCP target's PDU and command decoders
# (pdu_decode) and whole connections (conn_session), the NBD server's handshake and requests
# (nbd_session), and the HTTP API's JSON bodies and query strings (api_json).
#   1. replay: every input of the committed, minimised corpora (fuzz/corpus/TARGET) runs once
#      (-runs=0); any crash fails the run.
#   2. a short fuzz from those corpora: FUZZ_SECONDS each (30 by default) for pdu_decode and
#      conn_session, NBD_FUZZ_SECONDS (20) for nbd_session, API_FUZZ_SECONDS (20) for api_json,
#      FUZZ_JOBS targets at a time (2 by default: one per core). New inputs go to a scratch
#      folder; the committed corpora stay as they are.
# FUZZ_TARGETS picks some of them (e.g. FUZZ_TARGETS=api_json). The hour-long run of one target:
#   FUZZ_SECONDS=3600 FUZZ_TARGETS=pdu_decode bash scripts/fuzz.sh
# Needs nightly Rust and cargo-fuzz (scripts/setup.sh installs both, once per machine); installs
# them if it can, and fails, saying so, where it cannot. Exits non-zero on a crash and names the
# input that caused it; replay one with `cargo +nightly fuzz run TARGET ARTIFACT` in fuzz/.
# To grow a corpus: fuzz/seed.sh writes the seeds; after a run, `cargo +nightly fuzz cmin TARGET`
# in fuzz/ minimises fuzz/corpus/TARGET.
set -uo pipefail
cd "$(dirname "$0")/.."
secs=${FUZZ_SECONDS:-30}
nbd_secs=${NBD_FUZZ_SECONDS:-${FUZZ_SECONDS:-20}}
api_secs=${API_FUZZ_SECONDS:-${FUZZ_SECONDS:-20}}
jobs=${FUZZ_JOBS:-2}
targets=(${FUZZ_TARGETS:-pdu_decode conn_session nbd_session api_json})

if ! rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  if ! rustup toolchain install nightly --profile minimal; then
    echo "FAILED fuzz: no nightly Rust toolchain, and 'rustup toolchain install nightly' failed; cargo-fuzz needs nightly for its sanitizer flags, so nothing was fuzzed."
    exit 1
  fi
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  if ! cargo install cargo-fuzz --locked; then
    echo "FAILED fuzz: cargo-fuzz is not installed, and 'cargo install cargo-fuzz --locked' failed, so nothing was fuzzed."
    exit 1
  fi
fi

fuzz_target_dir=${CARGO_TARGET_DIR:-$PWD/target}/fuzz
cd fuzz
# The committed lock file is the one the build uses: where it misses a package (a dependency
# added to a crate the targets link), cargo would resolve one anew on every run.
if ! cargo +nightly metadata --locked --format-version 1 > /dev/null; then
  echo "FAILED fuzz: fuzz/Cargo.lock does not match the crates it builds; run 'cargo +nightly metadata --format-version 1 > /dev/null' in fuzz/ and commit fuzz/Cargo.lock."
  exit 1
fi
echo "--- build: ${targets[*]}"
cargo +nightly fuzz build --target-dir "$fuzz_target_dir" || { echo "FAILED fuzz: the build failed"; exit 1; }

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
status=0
# run T SECONDS LOG: fuzz T (SECONDS 0: replay its corpus once); its exit status in LOG.rc.
run() {
  local t=$1 s=$2 log=$3 opts
  mkdir -p "artifacts/$t" "corpus/$t" "$scratch/$t"
  if ((s == 0)); then
    opts=(corpus/"$t" -- -runs=0)
  else
    opts=("$scratch/$t" corpus/"$t" -- -max_total_time="$s")
  fi
  cargo +nightly fuzz run --target-dir "$fuzz_target_dir" "$t" "${opts[@]}" \
    -rss_limit_mb=2048 -timeout=30 -print_final_stats=1 > "$log" 2>&1
  echo $? > "$log.rc"
}
# report T LOG WHAT: print the log's end and fail on a crash or a new artifact.
report() {
  local t=$1 log=$2 what=$3 rc
  grep -v '^#[0-9]*.*\(NEW\|REDUCE\|pulse\)' "$log" | tail -n 40
  rc=$(cat "$log.rc" 2>/dev/null || echo 1)
  if ((rc != 0)) || [[ -n $(find "artifacts/$t" -type f -newer "$scratch/start") ]]; then
    status=1
    echo "FUZZ FAILURE in $t, $what (exit $rc); inputs that crashed it:"
    ls -t "artifacts/$t" | head -n 5 | sed "s|^|  fuzz/artifacts/$t/|"
  fi
}
seconds() {
  case $1 in
    nbd_*) echo "$nbd_secs" ;;
    api_*) echo "$api_secs" ;;
    *) echo "$secs" ;;
  esac
}
touch "$scratch/start"
for t in "${targets[@]}"; do
  echo "--- replay fuzz/corpus/$t ($(ls "corpus/$t" 2>/dev/null | wc -l) inputs, -runs=0)"
  run "$t" 0 "$scratch/$t.replay"
  report "$t" "$scratch/$t.replay" "replaying the committed corpus"
done
# FUZZ_JOBS at a time, each printed whole, in order, once all have ended.
for t in "${targets[@]}"; do
  while (($(jobs -rp | wc -l) >= jobs)); do wait -n || true; done
  run "$t" "$(seconds "$t")" "$scratch/$t.fuzz" &
done
wait
for t in "${targets[@]}"; do
  echo "--- fuzz $t for $(seconds "$t") s"
  report "$t" "$scratch/$t.fuzz" "fuzzing"
done
exit $status
