#!/usr/bin/env bash
# Runs blktests' nvme tests against Millrace in the throwaway guest (docs/CONFORMANCE.md).
# Not part of scripts/test.sh: under software emulation the whole group takes longer than the
# CI budget leaves to one guest script.
#   usage: tests/conformance/run-blktests.sh [TEST...]   (e.g. nvme/010 nvme/012; default: all of nvme)
#   Results: target/blktests/ (check.log, blktests' results folder, the server's log).
set -euo pipefail
cd "$(dirname "$0")/../.."
# The same build as scripts/test.sh, so the two share one set of compiled artifacts.
cargo build --workspace --bins --examples -q || { echo "run-blktests: building millrace failed (cargo build --workspace --bins --examples)"; exit 1; }
bt=$(tests/conformance/get-blktests.sh)
out=target/blktests
rm -rf "$out"; mkdir -p "$out"
# The guest writes its results into the shared target/ folder.
tests/guest/run-in-guest --timeout "${BLKTESTS_TIMEOUT:-3000}" --share target \
  tests/conformance/blktests-guest.sh "$PWD/target/debug" "$bt" "$PWD/$out" "$@"
