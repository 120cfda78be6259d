#!/usr/bin/env bash
# An unprivileged local attacker (a second Unix user) against a kv server run
# by this user, on tcp over loopback: without the secret it is refused, with a
# guessed secret it is refused, it cannot read the server's key file, and a
# genuine client is served before and after. Every wait is bounded.
#   kv_cross_user_test.sh PATH/TO/rdmakit-kv
# Exit 0 pass, 1 fail (also when not root: the test needs a second user).
set -uo pipefail
kv=$1
here=$(cd "$(dirname "$0")" && pwd)
if [ "$(id -u)" != 0 ]; then
  echo "FAIL: kv_cross_user_test needs root to create a second user"
  exit 1
fi
# shellcheck source=../support/second_user.sh
. "$here/../support/second_user.sh"
second_user_create || exit 1

work=$(mktemp -d)
chmod 755 "$work"
server_pid=
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
  rm -rf "$work"
  second_user_remove
}
trap cleanup EXIT
fail=0
check() {  # check DESCRIPTION CONDITION...
  local what=$1
  shift
  if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; fail=1; fi
}

umask 077
printf 'kv cross-user test secret %s\n' "$RANDOM$RANDOM$RANDOM" >"$work/kv.key"
unset RDMAKIT_SECRET RDMAKIT_SECRET_FILE
export RDMAKIT_LOG=off
timeout -s KILL 100 "$kv" server --provider tcp -p 0 --secret-file "$work/kv.key" \
  --auth-timeout-ms 1000 >"$work/server.log" 2>&1 &
server_pid=$!
port=
for _ in $(seq 100); do
  port=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9]*\) .*/\1/p' "$work/server.log")
  [ -n "$port" ] && break
  sleep 0.1
done
[ -n "$port" ] || { echo "FAIL: server did not start"; cat "$work/server.log"; exit 1; }
check "the server binds loopback with auth on" \
  grep -q "listening on 127.0.0.1:$port (provider tcp, auth on: secret from file" \
  "$work/server.log"

client() { timeout -s KILL 20 "$kv" client --provider tcp -p "$port" --timeout-ms 3000 "$@"; }
attacker() {
  as_second_user timeout -s KILL 20 "$kv" client --provider tcp -p "$port" \
    --timeout-ms 3000 "$@"
}

out=$(client --secret-file "$work/kv.key" put owner data 2>&1)
check "genuine client stores a key" test $? -eq 0

out=$(attacker get owner 2>&1)
rc=$?
check "attacker without secret fails" test $rc -ne 0
check "... with a clear error" grep -q "the server requires a secret" <<<"$out"
check "... and never sees the value" bash -c '! grep -q "data" <<<"$1"' _ "$out"

out=$(attacker --secret-file "$work/kv.key" get owner 2>&1)
check "attacker cannot use the server's key file" test $? -ne 0
check "... the file is refused" grep -qi "$work/kv.key" <<<"$out"

out=$(as_second_user env RDMAKIT_SECRET="guessed secret 0123456789abcdef" \
  timeout -s KILL 20 "$kv" client --provider tcp -p "$port" --timeout-ms 3000 \
  getr owner 2>&1)
rc=$?
check "attacker with a guessed secret fails" test $rc -ne 0
check "... authentication failed: wrong secret" \
  grep -q "authentication failed: wrong secret" <<<"$out"

out=$(client --secret-file "$work/kv.key" getr owner 2>&1)
check "genuine client still reads the key by READ" grep -q "value: data" <<<"$out"
check "the server logged the refusals with the peer" \
  grep -q "127.0.0.1:[0-9]*) refused: authentication failed: wrong secret" \
  "$work/server.log"
check "the server is still running" kill -0 "$server_pid"
[ $fail = 0 ] || cat "$work/server.log"
exit $fail
