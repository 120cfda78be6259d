#!/usr/bin/env bash
# The packaged rdmakit-cp daemon, started from its unit (unit-start.sh), takes
# a push from a local client of another user (root) that proves the secret.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
log=/tmp/rdmakit-cp-daemon.log
daemon=$("$here/unit-start.sh" rdmakit-cp.service "$log")
trap 'kill $daemon 2>/dev/null || true; wait $daemon 2>/dev/null || true' EXIT
for _ in $(seq 50); do grep -q "listening on" "$log" && break; sleep 0.1; done
grep -q "listening on" "$log" || { echo "FAIL: daemon did not start:"; cat "$log"; exit 1; }
head -c 3000000 /dev/urandom >/tmp/cp-payload
# A local client admits the daemon's user on shm (docs/packaging.md).
RDMAKIT_SHM_ALLOW_UIDS=rdmakit rdmakit-cp -q --secret-file /etc/rdmakit/cp.key \
  /tmp/cp-payload 127.0.0.1:pushed
root=$(sed -n 's/^root *= *//p' /etc/rdmakit/cp.conf)
cmp /tmp/cp-payload "$root/pushed"
owner=$(stat -c %U "$root/pushed")
[ "$owner" = rdmakit ] || { echo "FAIL: pushed file owned by $owner, not rdmakit"; exit 1; }
echo "cp-daemon: PASS (3 MB pushed to the unit's daemon, file owned by rdmakit)"
