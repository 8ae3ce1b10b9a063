#!/usr/bin/env bash
# The dashboard in headless Chromium (Debian's chromium, driven by playwright-core): a pool of
# six drive files, `millrace serve` on free ports, then dashboard.test.js. Installs
# playwright-core here (npm) when missing; builds the CLI. The screenshot lands in
# bench-out/dashboard/ (or $DASHBOARD_OUT).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"

chromium=${CHROMIUM:-/usr/bin/chromium}
if [[ ! -x $chromium ]]; then
  echo "dashboard test: $chromium is missing; install Debian's chromium (scripts/setup.sh does, or apt-get install chromium)" >&2
  exit 1
fi
if [[ ! -d $here/node_modules/playwright-core ]]; then
  (cd "$here" && npm install --no-audit --no-fund --loglevel=error)
fi
# shellcheck source=../lib/serve.sh
source "$root/tests/lib/serve.sh"
build_millrace
throwaway_home
drives=()
for i in 0 1 2 3 4 5; do drives+=("$tmp/drive$i.img"); done
"$bin" pool create tank --level raid6 --strip 64k --create 64M "${drives[@]}" >/dev/null

# With a token, as in production: the page must ask for it and send it.
token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
printf '%s\n' "$token" >"$tmp/token"
start_server "$tmp" --api 127.0.0.1:0 --nvme 127.0.0.1:0 --discovery-port 0 --token-file "$tmp/token"
echo "dashboard test: server at $url"

export MILLRACE_TOKEN=$token
# A volume and an export for the page to show (the CLI goes through the API).
"$bin" volume create tank/data --size 16M >/dev/null
"$bin" export nvme add tank/data --host nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001 >/dev/null

out=${DASHBOARD_OUT:-$root/bench-out/dashboard}
DASHBOARD_TOKEN=$token node "$here/dashboard.test.js" "$url" "$bin" tank "${drives[2]}" "${drives[4]}" "$out"
