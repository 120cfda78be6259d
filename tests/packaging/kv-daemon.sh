#!/usr/bin/env bash
# The packaged rdmakit-kv daemon, started from its unit (unit-start.sh), with
# a port from /etc/rdmakit/kv.conf: a PUT and a one-sided READ GET from root.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
log=/tmp/rdmakit-kv-daemon.log
echo "port = 7499" >>/etc/rdmakit/kv.conf
daemon=$("$here/unit-start.sh" rdmakit-kv.service "$log")
trap 'kill $daemon 2>/dev/null || true; wait $daemon 2>/dev/null || true' EXIT
for _ in $(seq 50); do grep -q "listening on" "$log" && break; sleep 0.1; done
grep -q "listening on .*:7499" "$log" || { echo "FAIL: daemon not on 7499:"; cat "$log"; exit 1; }
kv() { RDMAKIT_SHM_ALLOW_UIDS=rdmakit rdmakit-kv client -q -p 7499 \
         --secret-file /etc/rdmakit/kv.key "$@"; }
kv put packaged yes
got=$(kv get packaged --get read)
grep -qx "value: yes" <<<"$got" || { echo "FAIL: GET by READ: $got"; exit 1; }
echo "kv-daemon: PASS (config file port, PUT and READ GET, secret as credential)"
