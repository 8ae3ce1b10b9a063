#!/usr/bin/env bash
# Fetches and builds the pinned blktests (github.com/linux-blktests/blktests) into a folder the
# test guest can read (the guest sees this machine's filesystem read-only), and prints that folder.
# Pinned, so that docs/CONFORMANCE.md's table stays the table of a known version of the tests.
#   usage: tests/conformance/get-blktests.sh
#   BLKTESTS_REPO: where to clone from (default the GitHub repository; a local mirror works too)
#   BLKTESTS_DIR:  where to put it (default ~/.cache/millrace/blktests-COMMIT)
set -euo pipefail
commit=a608cb56341e0f4cacf473f5e0ac6052f1f12de9   # 2026-08-21, "block/045: respect dma_alignment"
repo=${BLKTESTS_REPO:-https://github.com/linux-blktests/blktests.git}
dir=${BLKTESTS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/millrace/blktests-${commit:0:12}}
# A finished build leaves this stamp; a half-done one (interrupted clone or make) is redone.
if [[ -f $dir/.millrace-built ]]; then echo "$dir"; exit 0; fi
rm -rf "$dir"; mkdir -p "$(dirname "$dir")"
git clone -q "$repo" "$dir" >&2 || { echo "get-blktests: could not clone blktests from $repo (set BLKTESTS_REPO to a reachable copy)" >&2; exit 1; }
git -C "$dir" -c advice.detachedHead=false checkout -q "$commit" >&2 \
  || { echo "get-blktests: $repo has no commit $commit; the pinned blktests version is needed for docs/CONFORMANCE.md's table" >&2; exit 1; }
# Its helpers in src/ are C; the nvme tests use few of them, and a missing optional library
# (liburing) only drops the io_uring ones, which make says and skips.
make -C "$dir" -j2 >/dev/null 2>&1 || { echo "get-blktests: building blktests' helpers failed (make -C $dir)" >&2; exit 1; }
touch "$dir/.millrace-built"
echo "$dir"
