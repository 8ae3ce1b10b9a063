#!/usr/bin/env bash
# Fails when a crate of the workspace (or one of its fuzz crates) declares a dependency it never
# uses (issue #20), as cargo-machete finds them: it reads the sources for each dependency's
# name, so it needs no build and takes seconds. A dependency used only through a macro or a
# renamed import can be kept with [package.metadata.cargo-machete] ignored = [...] in its
# Cargo.toml. Installs cargo-machete if it is missing; if that fails (no network), says SKIP.
set -uo pipefail
cd "$(dirname "$0")/.."
if ! cargo machete --version >/dev/null 2>&1; then
  if ! cargo install cargo-machete --locked; then
    echo "SKIP unused dependencies: cargo-machete is not installed and 'cargo install cargo-machete --locked' failed."
    exit 0
  fi
fi
cargo machete
