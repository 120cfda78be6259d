#!/usr/bin/env bash
# The shm provider between two Unix users: a root target, an unprivileged
# attacker created for this run (tests/support/second_user.sh).
#   1. another user is refused by default, with both uids and the opt-in named;
#   2. admitted, it gets exactly the grants: no other region, no writable
#      read-only grant (mmap, mprotect, /proc reopen), no register_memory()
#      memory; lying ring fields fail its own connection; a forged buffer
#      cannot steer the target's writes (confused deputy);
#   3. a squatted port name is reported by listen() and refused by connect(),
#      and the squatter never receives a descriptor;
# after each, the target still serves a genuine client, and at exit no byte
# it never granted has changed (guard bytes around every RECV buffer).
set -u
bin=${1:?attack binary}
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../support/second_user.sh"
second_user_create || exit 1
work=$(mktemp -d /tmp/rdmakit-shm-attack.XXXXXX)
chmod 755 "$work"
# The attacker must be able to run the binary and its libraries.
cp "$bin" "$work/attack"; chmod 755 "$work/attack"
export RDMAKIT_PROVIDER=shm RDMAKIT_LOG=warn
fails=0
target_pid=
cleanup() {
  [ -n "$target_pid" ] && kill -9 "$target_pid" 2>/dev/null
  wait 2>/dev/null
  rm -rf "$work"
  second_user_remove
}
trap cleanup EXIT
result() { if [ "$1" = 0 ]; then echo "ok: $2"; else echo "FAIL: $2"; fails=$((fails + 1)); fi; }

start_target() {  # start_target NAME [ENV...]
  local name=$1; shift
  rm -f "$work/$name.port" "$work/$name.port.stop"
  env "$@" "$work/attack" target "$work/$name.port" 60 >"$work/$name.log" 2>&1 &
  target_pid=$!
  for _ in $(seq 200); do [ -s "$work/$name.port" ] && break; sleep 0.05; done
  port=$(cat "$work/$name.port" 2>/dev/null)
  [ -n "$port" ] || { echo "FAIL: $name target did not start"; cat "$work/$name.log"; exit 1; }
}
stop_target() {  # stop_target NAME: the target's own integrity verdict
  local name=$1
  touch "$work/$name.port.stop"
  wait "$target_pid"; local rc=$?
  target_pid=
  cat "$work/$name.log"
  result $rc "$name: the target's memory outside its grants is intact"
}
as_attacker() { as_second_user env RDMAKIT_PROVIDER=shm RDMAKIT_LOG=warn "$@"; }

echo "== 1. another user, not admitted (attacker uid $SECOND_UID)"
start_target closed
as_attacker timeout 30 "$work/attack" refused "$port"; result $? "refused by default"
timeout 30 "$work/attack" genuine "$port"; result $? "closed: a genuine client is served afterwards"
grep -q "refused a connection (1 so far): the client is pid [0-9]* of uid $SECOND_UID, and we run as uid 0" "$work/closed.log"
result $? "closed: the target logged the refusal with both uids"
stop_target closed

echo "== 2. another user, admitted: exactly the grants"
start_target open RDMAKIT_SHM_ALLOW_UIDS="$SECOND_USER" RDMAKIT_TEST_EXPECT_ADDS=1
as_attacker RDMAKIT_SHM_ALLOW_UIDS=0 timeout 60 "$work/attack" attack "$port"
result $? "admitted attacker gets exactly what was granted"
timeout 30 "$work/attack" genuine "$port"; result $? "open: a genuine client is served afterwards"
grep -q "LOCAL_QP_OPERATION_ERROR" "$work/open.log" 2>/dev/null || sleep 0.5
stop_target open
lies=$(grep -c "LOCAL_QP_OPERATION_ERROR" "$work/open.log")
[ "$lies" -ge 6 ]
result $? "each of the 6 lying ring slots completed with an error on the attacker's connection ($lies)"

echo "== 3. a squatted port name"
squat_port=$((30000 + RANDOM % 20000))
as_second_user "$work/attack" squat "$squat_port" 8 >"$work/squat.log" 2>&1 &
squat_pid=$!
for _ in $(seq 100); do grep -q squatting "$work/squat.log" && break; sleep 0.05; done
timeout 30 "$work/attack" listen-squatted "$squat_port"; result $? "listen on a squatted name names the holder"
timeout 30 "$work/attack" connect-squatted "$squat_port"; result $? "connect to a squatted name is refused"
wait "$squat_pid"; rc=$?
cat "$work/squat.log"
result $rc "the squatter received no descriptor"

[ "$fails" = 0 ] && echo "security_shm_attack: all passed" || echo "security_shm_attack: $fails failed"
[ "$fails" = 0 ]
