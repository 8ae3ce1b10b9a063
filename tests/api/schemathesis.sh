#!/usr/bin/env bash
# OpenAPI conformance: schemathesis against the document `millrace serve` serves itself, on a
# throwaway home with a RAID 6 pool of six drive files and a volume. Checks: no 5xx, status
# codes, content types and response bodies as documented. Installs schemathesis (pip) when
# missing; builds the CLI; stops the server on exit.
#
# Left out of the generated calls, because they would write outside the throwaway pool or end
# the run's meaning: POST /api/v1/pools and /pools/import (they create drive files at generated
# paths), DELETE /api/v1/pools/{pool} (destroys the pool under test), PUT .../data (raw writes
# over the volume table), POST /api/v1/bench (a generated run could hold both cores for
# minutes), POST /api/v1/shares (on a host with nbd, xfs and nfsd it would mount and export). The Rust tests in crates/millrace-server/tests/it/api.rs cover them.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"

if ! command -v schemathesis >/dev/null; then
  python3 -m pip install -q schemathesis
  hash -r
fi
# shellcheck source=../lib/serve.sh
source "$root/tests/lib/serve.sh"
build_millrace
throwaway_home
"$bin" pool create tank --level raid6 --strip 64k --create 64M "$tmp"/d{0..5}.img >/dev/null
# The server runs in the temp folder: a relative path in a generated request lands there.
start_server "$tmp" --api 127.0.0.1:0 --nvme 127.0.0.1:0 --discovery-port 0
"$bin" volume create tank/v --size 8M >/dev/null

# Generated path parameters name the pool and volume that exist, so calls reach the handlers.
cat >"$tmp/schemathesis.toml" <<TOML
[parameters]
"path.pool" = "tank"
"path.vol" = "v"
TOML

rc=0
(cd "$tmp" && schemathesis --config-file "$tmp/schemathesis.toml" run "$url/api/v1/openapi.json" \
  --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance \
  --max-examples "${SCHEMATHESIS_EXAMPLES:-20}" --phases examples,coverage,fuzzing \
  --exclude-path /api/v1/pools/import \
  --exclude-path /api/v1/bench \
  --exclude-name "POST /api/v1/shares" \
  --exclude-name "POST /api/v1/pools" \
  --exclude-name "DELETE /api/v1/pools/{pool}" \
  --exclude-method PUT \
  --request-timeout 30 --workers 1 --seed 1 --no-color) || rc=$?
if ((rc)); then
  echo "schemathesis: the server disagrees with its OpenAPI document (see above); its log:" >&2
  tail -20 "$tmp/serve.log" >&2
fi
# Whatever the calls did, the server must still answer.
curl -fsS "$url/api/v1/status" >/dev/null || { echo "schemathesis: the server stopped answering" >&2; rc=1; }
exit $rc
