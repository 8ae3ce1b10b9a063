#!/usr/bin/env bash
# Builds what tests/guest/csi-node.sh runs in the guest into DIR (cargo's target/debug, as
# scripts/test.sh passes it): the driver, csi-sanity (pinned in csi/go.mod) and the driver's
# test binary (its guest test runs the node service against a real server).
set -euo pipefail
dir=$(realpath "${1:?usage: build-for-guest.sh DIR}")
cd "$(dirname "$0")/../../csi"
go build -o "$dir/millrace-csi" ./cmd/millrace-csi
go build -o "$dir/csi-sanity" github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity
go test -c -o "$dir/csi-guest.test" ./internal/driver
