#!/usr/bin/env bash
# run-in-guest:
# Runs inside the guest (tests/guest/run-in-guest), whose kernel has kernel TLS (the tls module),
# which this machine's may lack. Runs crates/millrace-nvmf/tests/tls.rs there: OpenSSL's client
# completes TLS 1.3 PSK handshakes with the target (TLS_AES_128_GCM_SHA256 and
# TLS_AES_256_GCM_SHA384), then an ICReq and an admin Connect travel in TLS records that the
# target's kernel opens and seals (a wrong traffic key or record sequence closes the connection
# and fails it); a Connect as another host than the PSK identity is refused; wrong keys,
# unknown identities, plain hosts, stalled and vanishing hosts are refused without holding up
# others. On a kernel without kTLS the same test checks only the handshakes.
#   usage (on the host): cargo test -p millrace-nvmf --test tls --no-run
#          tests/guest/run-in-guest tests/guest/nvme-tls-ktls.sh $PWD/target/debug
set -euo pipefail
DIR=$(realpath "${1:-$PWD/target/debug}")
# The newest build of the test (cargo names it tls-HASH; only millrace-nvmf has a tls test).
bin=$(find "$DIR/deps" -maxdepth 1 -name 'tls-*' -type f -perm -u+x -printf '%T@ %p\n' 2>/dev/null | sort -n | tail -1 | cut -d' ' -f2)
[[ -n $bin ]] || { echo "nvme-tls-ktls: FAILED: no build of crates/millrace-nvmf/tests/tls.rs under $DIR/deps; build it first (cargo test -p millrace-nvmf --test tls --no-run)"; exit 1; }
modprobe tls || { echo "nvme-tls-ktls: FAILED: this kernel has no tls module (CONFIG_TLS)"; exit 1; }
grep -qw tls /proc/sys/net/ipv4/tcp_available_ulp || { echo "nvme-tls-ktls: FAILED: the tls module is loaded but not listed in tcp_available_ulp"; exit 1; }
"$bin" --test-threads 1 || { echo "nvme-tls-ktls: FAILED: $bin"; exit 1; }
echo "nvme-tls-ktls: PASS (kernel TLS carried NVMe/TCP with both cipher suites)"
