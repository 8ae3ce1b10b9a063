#!/usr/bin/env bash
# run-in-guest: --disk 64M --disk 64M
# Runs inside the guest (tests/guest/run-in-guest). Proves DH-HMAC-CHAP (#49) against the stock
# Linux host (the kernel's nvme-fabrics and nvme-cli's connect) over NVMe/TCP: a volume on a
# RAID1 pool of two virtio disks, exported to one host NQN whose secret `nvme gen-dhchap-key`
# made. The right secret connects and what dd writes through the namespace reads back; a wrong
# secret and none are refused, and the server logs and counts the refusals; bidirectional: the
# right controller secret connects, a wrong one makes the host refuse the controller; keys
# transformed with SHA-256, SHA-384 and SHA-512 (and 32, 48 and 64 bytes long), each with the hash
# and DH group the server and the kernel agree on; rotation: `millrace export nvme host set-key`
# leaves the connected host working, a new connect with the old key is refused, the host
# re-authenticates with the new key (written to /sys/class/nvme/nvmeX/dhchap_secret) and keeps
# working, and a second controller connects with it. The hashes and groups the Linux host does
# not get from Millrace's target (it takes SHA-512 and ffdhe2048) are checked the other way round:
# Millrace's initiator (examples/dhchap_connect) against the kernel's target, nvmet.
# Linux 6.12 (the runner's default kernel) has NVMe in-band authentication; a kernel without it
# (Debian's 6.1, the runner's fallback where 6.12 cannot be installed) cannot check any of this:
# the script then says SKIPPED and exits 77, which run-all and scripts/test.sh count as skipped
# (a failure where CI is set), never as a pass.
#   usage (on the host): cargo build -p millrace-cli -p millrace-server && cargo build -p millrace-nvmf --example dhchap_connect
#          tests/guest/run-in-guest --timeout 1200 tests/guest/nvme-auth.sh $PWD/target/debug
set -euo pipefail
DIR=$(realpath "${1:-$PWD/target/debug}")
MR=$DIR/millrace
[[ -x $MR ]] || { echo "nvme-auth: millrace is missing under $DIR; build it first (cargo build -p millrace-cli -p millrace-server)"; exit 1; }
HOSTID=4d696c6c-7261-6365-0000-0000000049c1
HOST=nqn.2014-08.org.nvmexpress:uuid:$HOSTID
NQN=nqn.2026-11.dev.millrace:tank.auth   # the default subsystem NQN of tank/auth
work=$(mktemp -d /tmp/nvmeauth.XXXXXX)
export MILLRACE_HOME=$work/home MILLRACE_LOG=${MILLRACE_LOG:-info}
t0=$(date +%s)
step() { echo "nvme-auth: [$(( $(date +%s) - t0 ))s] $*"; }
fail() { # on stderr: it also runs inside $(...), whose output is a value
  {
    echo "nvme-auth: FAILED: $*"
    echo "--- server log (tail) ---"; tail -40 "$work/server.log" 2>/dev/null || true
    echo "--- kernel log (tail) ---"; dmesg | grep -iE 'nvme' | tail -30 || true
  } >&2
  exit 1
}
cleanup() {
  nvme disconnect-all >/dev/null 2>&1 || true
  [[ -n ${spid:-} ]] && kill "$spid" 2>/dev/null || true
}
trap cleanup EXIT

# The kernel's host side of DH-HMAC-CHAP: CONFIG_NVME_HOST_AUTH since 6.7, CONFIG_NVME_AUTH
# before (Debian's 6.1: not set). Without it nothing here can be checked.
kcfg=/boot/config-$(uname -r)
[[ -r $kcfg ]] || fail "no $kcfg to tell whether this kernel ($(uname -r)) has NVMe in-band authentication"
if grep -qE '^CONFIG_NVME_HOST_AUTH=y|^CONFIG_NVME_AUTH=y' "$kcfg" \
   && ! grep -q '^# CONFIG_NVME_HOST_AUTH is not set' "$kcfg"; then :; else
  echo "nvme-auth: SKIPPED: the guest's kernel $(uname -r) has no NVMe in-band authentication" \
    "($(grep -E 'CONFIG_NVME_(HOST_)?AUTH[ =]' "$kcfg" | tr '\n' ' ')); tests/guest/run-in-guest boots Linux 6.12 where it can install it"
  exit 77
fi
modprobe nvme-tcp || fail "cannot load nvme-tcp"

read -ra disks <<< "${RUN_IN_GUEST_DISKS:-}"
((${#disks[@]} == 2)) || fail "expected the runner's 2 virtio disks, RUN_IN_GUEST_DISKS is '${RUN_IN_GUEST_DISKS:-}'"
"$MR" pool create tank --level raid1 "${disks[@]}" > "$work/pool.out" 2>&1 \
  || { cat "$work/pool.out"; fail "millrace pool create on ${disks[*]}"; }
"$MR" volume create tank/auth --size 32M > /dev/null || fail "millrace volume create"
# Two listeners: nvme-cli refuses a second connect to an address and subsystem it is connected to.
"$MR" serve --nvme 127.0.0.1:4420 --nvme 127.0.0.1:4421 >> "$work/server.log" 2>&1 &
spid=$!
for _ in $(seq 150); do
  [[ -s $MILLRACE_HOME/server.json ]] && (exec 3<>/dev/tcp/127.0.0.1/4421) 2>/dev/null && break
  kill -0 "$spid" 2>/dev/null || fail "millrace serve exited"
  sleep 0.3
done
api=$(sed -n 's/^ *"url": *"\(.*\)",\?$/\1/p' "$MILLRACE_HOME/server.json")
[[ -n $api ]] || fail "no API url in server.json"

# key FILE ARGS...: a secret from nvme gen-dhchap-key (ARGS: its -m, -l, -n).
key() { local f=$work/$1.key; shift; nvme gen-dhchap-key "$@" > "$f" 2>&1 || { cat "$f"; fail "nvme gen-dhchap-key $*"; }; grep -q '^DHHC-1:' "$f" || fail "gen-dhchap-key $* wrote $(cat "$f")"; }
sec() { cat "$work/$1.key"; }
key k1 -m 1 -n "$HOST"            # SHA-256 transformation, 32 bytes (the default length)
key k2 -m 2 -l 48 -n "$HOST"      # SHA-384, 48 bytes
key k3 -m 3 -l 64 -n "$HOST"      # SHA-512, 64 bytes
key k0 -m 0 -l 32                 # used as it is
key bad -m 1 -n "$HOST"           # a well-formed secret the server does not have
key c1 -m 1 -n "$NQN"             # controller secrets (transformed with the subsystem's NQN)
key c2 -m 2 -l 48 -n "$NQN"
key cbad -m 1 -n "$NQN"
[[ $(sec k1) == DHHC-1:01:* && $(sec k2) == DHHC-1:02:* && $(sec k3) == DHHC-1:03:* && $(sec k0) == DHHC-1:00:* ]] \
  || fail "gen-dhchap-key's secrets do not name the transformations asked for: $(cat "$work"/k?.key | tr '\n' ' ')"

"$MR" export nvme add tank/auth --host "$HOST" --dhchap-secret "$work/k1.key" > "$work/export.out" 2>&1 \
  || { cat "$work/export.out"; fail "millrace export nvme add --dhchap-secret"; }
"$MR" export list > "$work/list" || fail "millrace export list"
grep -q "$HOST (dhchap: host)" "$work/list" || { cat "$work/list"; fail "export list does not show the host authenticating"; }
grep -q "DHHC-1" "$work/list" && fail "export list shows a secret"
step "tank/auth exported to $HOST with a DH-HMAC-CHAP secret (SHA-256 transformed)"

# The server's counts of authentications of the subsystem (millrace_nvme_auth_total).
count() { # succeeded|failed
  python3 - "$api/metrics" "$NQN" "$1" <<'EOF' || fail "GET /metrics"
import sys, urllib.request
want = 'millrace_nvme_auth_total{subsystem="%s",result="%s"}' % (sys.argv[2], sys.argv[3])
for line in urllib.request.urlopen(sys.argv[1], timeout=30).read().decode().splitlines():
    if line.startswith(want + " "):
        print(int(float(line.split()[-1]))); break
else:
    print(0)
EOF
}
ctrl_of() { # PORT: the controller (nvmeN) of HOST on that port
  local c
  for c in /sys/class/nvme/nvme*; do
    [[ $(cat "$c/subsysnqn" 2>/dev/null) == "$NQN" && $(cat "$c/hostnqn" 2>/dev/null) == "$HOST" \
       && $(cat "$c/address" 2>/dev/null) == *"trsvcid=$1"* ]] && { basename "$c"; return 0; }
  done
  return 1
}
# conn PORT HOSTKEY [CTRLKEY]: nvme connect with those secrets (- for none); the status is nvme's.
conn() {
  local a=(nvme connect -t tcp -a 127.0.0.1 -s "$1" -n "$NQN" --hostnqn "$HOST" --hostid "$HOSTID" -i 1)
  [[ $2 != - ]] && a+=(--dhchap-secret "$(sec "$2")")
  [[ -n ${3:-} ]] && a+=(--dhchap-ctrl-secret "$(sec "$3")")
  timeout 120 "${a[@]}" > "$work/connect.out" 2>&1
}
# ns_of CTRL: the namespace's block device through that controller. With native multipath
# (nvme_core's default) a second controller's path (nvme0c1n1) is hidden behind the
# namespace's one device (nvme0n1).
ns_of() {
  local p
  for p in /sys/class/nvme/"$1"/nvme*n1; do
    [[ -e $p ]] || continue
    p=${p##*/}; p=/dev/${p/c[0-9]*n/n}
    [[ -b $p ]] && { echo "$p"; return 0; }
  done
  return 1
}
# must_connect PORT HOSTKEY [CTRLKEY]: connects, and bytes written through the namespace read back.
must_connect() {
  local c n
  conn "$@" || { cat "$work/connect.out" >&2; fail "nvme connect with $2${3:+ and controller key $3} on $1 was refused"; }
  for _ in $(seq 100); do c=$(ctrl_of "$1") && ns_of "$c" > /dev/null && break; sleep 0.2; done
  c=$(ctrl_of "$1") || fail "no controller after connecting with $2 on $1"
  n=$(ns_of "$c") || fail "$c has no namespace block device ($(ls /sys/class/nvme/"$c" | tr '\n' ' '))"
  roundtrip "$n"
  echo "$c"
}
roundtrip() { # DEV: 1 MiB at a random MiB written with O_DIRECT, read back the same
  local at=$((RANDOM % 30))
  head -c 1048576 /dev/urandom > "$work/w.bin"
  dd if="$work/w.bin" of="$1" bs=1M seek="$at" count=1 oflag=direct status=none 2> "$work/dd.out" \
    || { cat "$work/dd.out"; fail "writing through $1"; }
  dd if="$1" of="$work/r.bin" bs=1M skip="$at" count=1 iflag=direct status=none 2> "$work/dd.out" \
    || { cat "$work/dd.out"; fail "reading through $1"; }
  cmp -s "$work/w.bin" "$work/r.bin" || fail "$1 read back other bytes than were written at MiB $at"
}
# refused PORT HOSTKEY [CTRLKEY]: the connect fails, leaves no controller, and the server counts
# a failed authentication (so it was refused for that, not by nvme-cli or the kernel's checks).
refused() {
  local before n
  before=$(count failed)
  conn "$@" && fail "nvme connect with ${2/-/no secret}${3:+ and controller key $3} on $1 was let in"
  ! ctrl_of "$1" > /dev/null || fail "a refused connect left controller $(ctrl_of "$1")"
  for _ in $(seq 50); do n=$(count failed); ((n > before)) && return 0; sleep 0.2; done
  cat "$work/connect.out" >&2
  fail "nvme connect with ${2/-/no secret}${3:+ and controller key $3} on $1 failed, but the server counted no failed authentication"
}
disconnect() { nvme disconnect -d "$1" > /dev/null 2>&1 || fail "nvme disconnect -d $1"; }
# negotiated: the hash and group of the server's last logged authentication.
negotiated() { grep 'a host authenticated' "$work/server.log" | tail -1 | grep -oE 'hash="?[A-Z0-9-]+"? group="?[a-z0-9]+"?' | tr -d '"' || echo "(not logged)"; }

ok0=$(count succeeded) bad0=$(count failed)
c=$(must_connect 4420 k1)
ok1=$(count succeeded)
((ok1 >= ok0 + 2)) || fail "the server counted $((ok1 - ok0)) authentications for an admin and an I/O queue"
grep -q "a host authenticated" "$work/server.log" || fail "the server did not log the authentication"
step "the right secret (SHA-256 transformed): connected as $c, 1 MiB written and read back; $((ok1 - ok0)) queues authenticated, $(negotiated)"
disconnect "$c"

refused 4420 bad
bad1=$(count failed)
((bad1 > bad0)) || fail "a wrong secret was not counted as a failed authentication ($bad0 before, $bad1 after)"
grep -q "refused an authentication: its response does not match" "$work/server.log" || fail "the server did not log the wrong secret"
refused 4420 -
bad2=$(count failed)
((bad2 > bad1)) || fail "a host without a secret was not counted as a failed authentication ($bad1 before, $bad2 after)"
step "a wrong secret and no secret refused; the server logged and counted both (failed: $bad0 -> $bad2)"

refused 4420 k1 c1
step "a host asking the controller to prove itself, where the export has no controller secret: refused"

"$MR" export nvme host set-key tank/auth "$HOST" --dhchap-secret "$work/k1.key" --dhchap-ctrl-secret "$work/c1.key" > "$work/setkey.out" 2>&1 \
  || { cat "$work/setkey.out"; fail "set-key with a controller secret"; }
"$MR" export list > "$work/list" || fail "millrace export list"
grep -q "$HOST (dhchap: bidirectional)" "$work/list" || { cat "$work/list"; fail "export list does not show bidirectional authentication"; }
c=$(must_connect 4420 k1 c1)
step "bidirectional with the right controller secret: connected as $c, I/O read back; $(negotiated)"
disconnect "$c"
bad3=$(count failed)
refused 4420 k1 cbad
dmesg | tail -20 | grep -qiE "controller authentication failed|authentication failed" \
  || { dmesg | tail -20; fail "the kernel did not say it refused the controller"; }
((  $(count failed) > bad3 )) || fail "the host's refusal of the controller (Failure2) was not counted"
grep -q "did not accept the controller's response" "$work/server.log" || fail "the server did not log the host's refusal of the controller"
step "bidirectional with a wrong controller secret: the host refused the controller (the server logged and counted it)"

for m in 0 2 3; do
  ctl=
  [[ $m == 2 ]] && ctl=c2   # SHA-384 both ways
  "$MR" export nvme host set-key tank/auth "$HOST" --dhchap-secret "$work/k$m.key" ${ctl:+--dhchap-ctrl-secret "$work/$ctl.key"} > "$work/setkey.out" 2>&1 \
    || { cat "$work/setkey.out"; fail "set-key to k$m"; }
  c=$(must_connect 4420 "k$m" $ctl)
  step "secret $(cut -d: -f1-2 "$work/k$m.key") of $(($(cut -d: -f3 "$work/k$m.key" | base64 -d | wc -c) - 4)) bytes${ctl:+, bidirectional}: connected, I/O read back; $(negotiated)"
  disconnect "$c"
done

# Rotation: connected with k1, the server's secret becomes k2.
"$MR" export nvme host set-key tank/auth "$HOST" --dhchap-secret "$work/k1.key" > /dev/null || fail "set-key back to k1"
c=$(must_connect 4420 k1)
"$MR" export nvme host set-key tank/auth "$HOST" --dhchap-secret "$work/k2.key" > "$work/setkey.out" 2>&1 \
  || { cat "$work/setkey.out"; fail "set-key to k2 while the host is connected"; }
roundtrip "$(ns_of "$c")"
step "set-key while $c is connected: its I/O goes on"
refused 4421 k1
step "a new connect with the old secret is refused"
ok2=$(count succeeded) bad4=$(count failed)
[[ -w /sys/class/nvme/$c/dhchap_secret ]] || fail "/sys/class/nvme/$c/dhchap_secret is missing: the kernel cannot re-authenticate"
sec k2 > "/sys/class/nvme/$c/dhchap_secret" || fail "writing the new secret to /sys/class/nvme/$c/dhchap_secret"
for _ in $(seq 150); do (( $(count succeeded) >= ok2 + 2 )) && break; sleep 0.2; done
(( $(count succeeded) >= ok2 + 2 )) || fail "the host did not re-authenticate its 2 queues with the new secret (succeeded: $ok2 -> $(count succeeded))"
(( $(count failed) == bad4 )) || fail "a re-authentication with the new secret failed"
roundtrip "$(ns_of "$c")"
step "$c re-authenticated with the new secret (sysfs dhchap_secret) and its I/O goes on"
c2=$(must_connect 4421 k2)
step "a second controller ($c2) connects with the new secret"
disconnect "$c2"; disconnect "$c"
kill -0 "$spid" || fail "the server died"

# The other hashes and groups: the Linux host offers them all and Millrace's target takes the
# strongest hash and ffdhe2048, so the rest meet Linux's code the other way round: Millrace's
# initiator (examples/dhchap_connect, the same dhchap module) against the kernel's target. It
# offers one hash and one group, which nvmet takes; nvmet set to the null group refuses a host
# that offers only null (6.12 takes an offered group other than its own, else its own if it has
# a DH implementation, which null has not), so for null it is set to ffdhe2048.
EX=$DIR/examples/dhchap_connect
[[ -x $EX ]] || fail "$EX is missing; build it first (cargo build -p millrace-nvmf --example dhchap_connect)"
modprobe nvmet-tcp || fail "cannot load nvmet-tcp"
mountpoint -q /sys/kernel/config || mount -t configfs configfs /sys/kernel/config || fail "cannot mount configfs"
cfs=/sys/kernel/config/nvmet KNQN=nqn.2026-11.dev.millrace:nvmet.auth kh=$cfs/hosts/$HOST
truncate -s 16M "$work/nvmet.img"
{
  mkdir "$cfs/subsystems/$KNQN" && echo 0 > "$cfs/subsystems/$KNQN/attr_allow_any_host" \
    && mkdir "$cfs/subsystems/$KNQN/namespaces/1" \
    && echo -n "$work/nvmet.img" > "$cfs/subsystems/$KNQN/namespaces/1/device_path" \
    && echo 1 > "$cfs/subsystems/$KNQN/namespaces/1/buffered_io" \
    && echo 1 > "$cfs/subsystems/$KNQN/namespaces/1/enable" \
    && mkdir "$kh" && sec k1 > "$kh/dhchap_key" \
    && ln -s "$kh" "$cfs/subsystems/$KNQN/allowed_hosts/" \
    && mkdir "$cfs/ports/1" && echo tcp > "$cfs/ports/1/addr_trtype" && echo ipv4 > "$cfs/ports/1/addr_adrfam" \
    && echo 127.0.0.1 > "$cfs/ports/1/addr_traddr" && echo 4430 > "$cfs/ports/1/addr_trsvcid" \
    && ln -s "$cfs/subsystems/$KNQN" "$cfs/ports/1/subsystems/"
} 2> "$work/nvmet.out" || { cat "$work/nvmet.out" >&2; fail "setting up the kernel target (nvmet) with a host secret"; }
groups=(null ffdhe2048 ffdhe3072 ffdhe4096 ffdhe6144 ffdhe8192)
said=()
for h in 1 2 3; do
  for g in 0 1 2 3 4 5; do
    hn=sha$((h == 1 ? 256 : h == 2 ? 384 : 512))
    echo "hmac($hn)" > "$kh/dhchap_hash" && echo "${groups[g > 0 ? g : 1]}" > "$kh/dhchap_dhgroup" \
      || fail "nvmet refuses hash $hn or group ${groups[g]} for the host"
    timeout 120 "$EX" --addr 127.0.0.1:4430 --nqn "$KNQN" --host "$HOST" --secret-file "$work/k1.key" --hash $h --group $g \
      > "$work/ex.out" 2>&1 || { cat "$work/ex.out" >&2; fail "Millrace's host side against nvmet with $hn and ${groups[g]}"; }
  done
  said+=("$hn")
done
step "Millrace's initiator against the kernel's target: ${said[*]} each with null and ffdhe2048 to ffdhe8192"
sec c1 > "$kh/dhchap_ctrl_key" || fail "setting nvmet's controller secret"
timeout 120 "$EX" --addr 127.0.0.1:4430 --nqn "$KNQN" --host "$HOST" --secret-file "$work/k1.key" --ctrl-secret-file "$work/c1.key" --hash 3 --group 5 \
  > "$work/ex.out" 2>&1 || { cat "$work/ex.out" >&2; fail "Millrace's host side against nvmet both ways"; }
sec cbad > "$kh/dhchap_ctrl_key"
timeout 120 "$EX" --addr 127.0.0.1:4430 --nqn "$KNQN" --host "$HOST" --secret-file "$work/k1.key" --ctrl-secret-file "$work/c1.key" --hash 3 --group 5 \
  > "$work/ex.out" 2>&1 && fail "Millrace's host side accepted nvmet with another controller secret"
step "both ways against the kernel's target (SHA-512, ffdhe8192): the right controller secret authenticates, another is refused"
step "PASS (authentications: $(count succeeded) succeeded, $(count failed) failed)"
