#!/usr/bin/env bash
# The package stage's checks, as root inside a fresh Debian 12 chroot where
# librdmakit0, librdmakit-dev and rdmakit-tools were just installed with
# apt-get (tests/stages/package.sh copies this directory to /tmp/packaging).
#   in-chroot.sh DEB_DIR
set -euo pipefail
debs=$1
here=$(cd "$(dirname "$0")" && pwd)
export RDMAKIT_LOG=warn
step() { echo "=== [package] $*"; }

step "rdmakit-perf --loopback (shm)"
RDMAKIT_PROVIDER=shm rdmakit-perf --loopback send_lat -n 2000 | tail -3

step "iperf3 pair under rdmakit-run: path=shm"
log=/tmp/preload.log
rm -f "$log"
rdmakit-run --log "$log" iperf3 -s -1 -p 5299 >/dev/null &
server=$!
sleep 1
rdmakit-run --stats --log "$log" iperf3 -c 127.0.0.1 -p 5299 -t 1 | tail -4
wait $server
grep "path=" "$log"
grep -q "connect .*path=shm" "$log" && grep -q "accept .*path=shm" "$log" ||
  { echo "FAIL: no shm connection in $log"; exit 1; }

step "systemd-analyze verify: the units"
systemd-analyze verify rdmakit-cp.service rdmakit-kv.service

step "rdmakit-cp daemon from its unit file"
"$here/cp-daemon.sh"

step "rdmakit-kv daemon from its unit file, port from kv.conf"
"$here/kv-daemon.sh"

step "consumer: find_package(rdmakit) and pkg-config"
"$here/consumer-build.sh" /tmp/consumer

step "man pages"
for page in rdmakit-cp rdmakit-kv rdmakit-run rdmakit-perf "7 rdmakit-preload"; do
  # shellcheck disable=SC2086
  MANWIDTH=80 man $page 2>/dev/null | col -b >/tmp/man.txt
  [ -s /tmp/man.txt ] || { echo "FAIL: man $page renders nothing"; exit 1; }
  echo "man $page: $(wc -l </tmp/man.txt) lines"
done
# Rendered to a file first: grep -q leaving early would end col with
# SIGPIPE, which pipefail counts as a failure.
MANWIDTH=80 man rdmakit-cp 2>/dev/null | col -b >/tmp/man.txt
grep -q "rdmakit-cp serve" /tmp/man.txt || { echo "FAIL: man rdmakit-cp lacks the daemon"; exit 1; }

step "lintian --fail-on error"
lintian --fail-on error "$debs"/*.deb
echo "in-chroot: PASS"
