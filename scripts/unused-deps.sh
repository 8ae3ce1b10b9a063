#!/usr/bin/env bash
# Fails when a crate of the workspace (or one of its fuzz crates) declares a dependency it never
# uses (issue #20), as cargo-machete finds them: it reads the sources for each dependency's
# name, so it needs no build and takes seconds. A dependency used only through a macro or a
# renamed import can be kept with [package.metadata.cargo-machete] ignored = [...] in its
# Cargo.toml. scripts/setup.sh installs cargo-machete (once per machine); this installs it if it
# is still missing, and fails, saying so, where it cannot: an unchecked tree is not a pass.
set -uo pipefail
cd "$(dirname "$0")/.."
if ! cargo machete --version >/dev/null 2>&1; then
  if ! cargo install cargo-machete --locked; then
    echo "FAILED unused dependencies: cargo-machete is not installed and 'cargo install cargo-machete --locked' failed (no network?), so nothing was checked; run scripts/setup.sh where crates.io can be reached."
    exit 1
  fi
fi
cargo machete
