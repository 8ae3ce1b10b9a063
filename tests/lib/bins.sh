# Sourced by the scripts that run Millrace's binaries and examples (tests/lib/serve.sh,
# tests/soak/run.sh): millrace_bins sets `bins`, the folder that holds them (cargo's
# target/debug). scripts/test.sh builds them once, beside the tests (one profile, one feature
# set), and names the folder in MILLRACE_BINS, so these scripts build nothing. Run alone, a script
# builds them the same way: the whole workspace's binaries and examples, whose build the tests
# share, never a `-p` build, whose other features would build the shared crates again.
millrace_bins() {
  if [[ -n ${MILLRACE_BINS:-} ]]; then
    bins=$MILLRACE_BINS
    return
  fi
  cargo build --workspace --bins --examples -q || return 1
  bins=$(cargo metadata --format-version 1 --no-deps |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/debug
}
