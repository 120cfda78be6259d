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
second_user_stage "$work/bin" "$kv" || { echo "FAIL: staging $kv"; exit 1; }
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
# The port a server's log says it listens on (waits up to 10 s; empty if none).
listening_port() {
  local p=
  for _ in $(seq 100); do
    p=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9]*\) .*/\1/p' "$1")
    [ -n "$p" ] && break
    sleep 0.1
  done
  echo "$p"
}
port=$(listening_port "$work/server.log")
[ -n "$port" ] || { echo "FAIL: server did not start"; cat "$work/server.log"; exit 1; }
check "the server binds loopback with auth on" \
  grep -q "listening on 127.0.0.1:$port (provider tcp, auth on: secret from file" \
  "$work/server.log"

client() { timeout -s KILL 20 "$kv" client --provider tcp -p "$port" --timeout-ms 3000 "$@"; }
attacker() {
  as_second_user timeout -s KILL 20 "$SECOND_USER_BIN" client --provider tcp -p "$port" \
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
  timeout -s KILL 20 "$SECOND_USER_BIN" client --provider tcp -p "$port" --timeout-ms 3000 \
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

# shm: another user is refused by the provider unless the server admits it;
# admitted and holding the secret (its own copy of the key), it works: PUT
# (a SEND of more than a slot: the payload socket), GET by message and by READ.
cp "$work/kv.key" "$work/kv-second.key"
chown "$SECOND_USER" "$work/kv-second.key"
start_shm_server() {  # start_shm_server [ENV...]
  env "$@" timeout -s KILL 60 "$kv" server --provider shm -p 0 --secret-file "$work/kv.key" \
    >"$work/shm-server.log" 2>&1 &
  shm_pid=$!
  shm_port=$(listening_port "$work/shm-server.log")
}
shm_client() {  # shm_client ENV... -- ARGS...: as the second user
  local envs=()
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  as_second_user env "${envs[@]}" timeout -s KILL 20 "$SECOND_USER_BIN" client --provider shm \
    -p "$shm_port" --timeout-ms 3000 --secret-file "$work/kv-second.key" "$@"
}
value="a value of more than twenty bytes, so the request takes the payload path"
start_shm_server
out=$(shm_client RDMAKIT_SHM_ALLOW_UIDS=0 -- get owner 2>&1)
check "shm: another user, not admitted by the server, is refused" \
  grep -q "does not admit processes of our uid $SECOND_UID" <<<"$out"
kill "$shm_pid" 2>/dev/null; wait "$shm_pid" 2>/dev/null
start_shm_server RDMAKIT_SHM_ALLOW_UIDS="$SECOND_USER"
out=$(shm_client -- get owner 2>&1)
check "shm: a listener of another user is refused by the client unless admitted" \
  grep -q "the shm listener on this port is pid [0-9]* of uid 0" <<<"$out"
out=$(shm_client RDMAKIT_SHM_ALLOW_UIDS=0 -- put shared "$value" 2>&1)
check "shm: admitted, another user's PUT is stored" grep -q "stored" <<<"$out"
out=$(shm_client RDMAKIT_SHM_ALLOW_UIDS=0 -- get shared 2>&1)
check "shm: ... and read back by message" grep -qF "value: $value" <<<"$out"
out=$(shm_client RDMAKIT_SHM_ALLOW_UIDS=0 -- getr shared 2>&1)
check "shm: ... and by one-sided READ" grep -qF "value: $value" <<<"$out"
kill "$shm_pid" 2>/dev/null; wait "$shm_pid" 2>/dev/null

[ $fail = 0 ] || cat "$work/server.log" "$work/shm-server.log"
exit $fail
