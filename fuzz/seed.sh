#!/usr/bin/env bash
# Writes the seed inputs of the fuzz targets into fuzz/corpus (run from anywhere): NVMe/TCP PDU
# streams from the target's own encoder (crates/millrace-nvmf/examples/nvmf_fuzz_seeds.rs), and
# for api_json one valid body of each kind the target reads (its first byte picks the kind), so
# inputs start past JSON's syntax. nbd_session starts from nothing. The committed corpora are
# these seeds plus what short runs found, minimised (`cargo +nightly fuzz cmin TARGET` in fuzz/):
# run this, fuzz a while, minimise, and commit what is left if it stays small.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo run -q -p millrace-nvmf --example nvmf_fuzz_seeds -- fuzz/corpus
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
mkdir -p fuzz/corpus/api_json fuzz/corpus/nbd_session
for i in "${!api_seeds[@]}"; do
  { printf "\\$(printf %03o "$i")"; printf '%s' "${api_seeds[$i]}"; } > "fuzz/corpus/api_json/seed-$i"
done
