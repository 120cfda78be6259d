#!/usr/bin/env bash
# Connections between processes of different users on one host, both ends
# preloaded (docs/preload.md, "Between users"): other_users_test.sh CASE RUN LIB
#   service-server  a forking server runs as a service user, the client as
#                   root: every connection on shm, served by the forked child
#   service-client  the server runs as root, the client as the service user
#   squat           a third user takes the abstract offer name of a
#                   connection it predicts: the client and the server both
#                   stay on kernel TCP with the reason, every byte intact, and
#                   the squatter receives no descriptor and no byte
#   forged-registration  a third user registers a port where a plain server
#                   listens: the client does not offer (no wait), kernel TCP
# Each side has its own private rendezvous directory; the host-wide
# registrations live in a directory of the test's own (sticky, like /dev/shm).
set -euo pipefail
case_name=$1 run=$(realpath "$2") lib=$(realpath "$3")
here=$(cd "$(dirname "$0")" && pwd)
[ "$(id -u)" = 0 ] || { echo "FAIL [$case_name]: needs root (a second user)"; exit 1; }
work=$(mktemp -d /tmp/rdmakit-users.XXXXXX)
chmod 755 "$work"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  second_user_remove 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL [$case_name]: $*" >&2; sed 's/^/  log: /' "$work/log" >&2 2>/dev/null || true; exit 1; }
. "$here/../support/second_user.sh"
second_user_create || fail "no second user"
trap cleanup EXIT
second_user_stage "$work/bin" "$run"; srun=$SECOND_USER_BIN
second_user_stage "$work/lib" "$lib"; slib=$SECOND_USER_BIN
# The scripts too: the checkout may sit where the other users cannot read
# (a 0700 temporary directory).
shapes=$work/py
mkdir -m 755 "$shapes"
cp "$here"/shapes/server.py "$here"/shapes/client.py "$here"/shapes/offer_squatter.py "$shapes/"
chmod 644 "$shapes"/*.py
log=$work/log
: >"$log"; chmod 666 "$log"
mkdir -m 1777 "$work/host"
export RDMAKIT_PRELOAD_HOST_DIR=$work/host
mkdir -m 700 "$work/rdv-root" "$work/rdv-svc"
chown "$SECOND_UID:$SECOND_GID" "$work/rdv-svc"
mkdir -m 755 "$work/svc" "$work/nobody"; chown "$SECOND_UID:$SECOND_GID" "$work/svc"; chown 65534:65534 "$work/nobody"
as_root() { "$run" --log "$log" --dir "$work/rdv-root" "$@"; }
as_svc() {
  as_second_user RDMAKIT_PRELOAD_HOST_DIR="$work/host" "$srun" --lib "$slib" --log "$log" \
    --dir "$work/rdv-svc" "$@"
}
as_nobody() { setpriv --reuid 65534 --regid 65534 --clear-groups --no-new-privs -- "$@"; }
# The system python: a user's own (pyenv) may sit where the other users cannot reach.
py=/usr/bin/python3
count() { grep -cE "$1" "$log" || true; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_file() { for _ in $(seq 200); do [ -s "$1" ] && return 0; sleep 0.05; done; return 1; }
conns=5 size=300000

# server WRAPPER...: the forking echo server (shapes/server.py) in the
# background; its port in $port.
server() {
  "$@" timeout 60 "$py" "$shapes/server.py" fork "$work/svc/port" "$sconns" \
    >"$work/s.out" 2>&1 &
  pids+=($!)
  wait_file "$work/svc/port" || fail "server did not start: $(cat "$work/s.out")"
  port=$(cat "$work/svc/port")
}
check_server() {
  wait "${pids[-1]}" || fail "server: $(cat "$work/s.out")"
  grep -q '^OK' "$work/s.out" || fail "server: $(cat "$work/s.out")"
}

case "$case_name" in
  service-server | service-client)
    sconns=$conns
    if [ "$case_name" = service-server ]; then
      server as_svc; client=(as_root) cname=root sname=svc
    else
      server as_root; client=(as_svc) cname=svc sname=root
    fi
    "${client[@]}" timeout 60 "$py" "$shapes/client.py" "$port" $conns $size \
      >"$work/c.out" 2>&1 || fail "client: $(cat "$work/c.out")"
    check_server
    tail -n 1 "$work/c.out" | grep -q '^OK' || fail "client: $(cat "$work/c.out")"
    [ "$(count "connect fd=[0-9]+ .*path=shm")" = $conns ] || fail "client connections not all on shm"
    # Each connection adopted on shm by the forked child that served it.
    for pid in $(grep -oE '^child:[0-9]+' "$work/c.out" | cut -d: -f2); do
      grep -qE "^rdmakit-preload\[$pid [^]]*\]: accept fd=[0-9]+ .*path=shm" "$log" ||
        fail "child $pid did not adopt its connection on shm"
    done
    [ "$(count 'path=kernel|path=none')" = 0 ] || fail "connections off the fast path"
    # The handshake's own descriptors (a peer of another user sends a wake
    # socket) are never taken for the application's (under a sanitizer too).
    [ "$(count 'inherited fd=')" = 0 ] || fail "a descriptor of the rendezvous taken for the application's"
    echo "OK $case_name: $conns connections between $cname (client) and $sname (server) on shm"
    ;;
  squat)
    sconns=1
    server as_svc
    cport=$(free_port)
    # (not through the function: $! must be the squatter itself, to signal it)
    setpriv --reuid 65534 --regid 65534 --clear-groups --no-new-privs -- \
      "$py" "$shapes/offer_squatter.py" "$cport" "$port" "$work/nobody/squat" \
      >"$work/squat.out" 2>&1 &
    squatter=$!
    wait_file "$work/nobody/squat" || fail "squatter did not start: $(cat "$work/squat.out")"
    as_root timeout 60 "$py" "$shapes/client.py" "$port" 1 $size "$cport" \
      >"$work/c.out" 2>&1 || fail "client: $(cat "$work/c.out")"
    check_server
    tail -n 1 "$work/c.out" | grep -q '^OK' || fail "client: $(cat "$work/c.out")"
    kill "$squatter"; wait "$squatter" || true
    grep -q '^fds=0 bytes=0$' "$work/squat.out" || fail "the squatter got: $(cat "$work/squat.out")"
    grep -qE "connect fd=[0-9]+ .*path=kernel reason=.*offer socket for this connection is taken" "$log" ||
      fail "the client did not refuse the squatted name"
    [ "$(count "path=shm")" = 0 ] || fail "a connection was upgraded past the squatter"
    echo "OK squat: both ends on kernel TCP, the squatter got nothing"
    ;;
  forged-registration)
    sconns=1
    server timeout 60  # a plain server of root
    ns=$(stat -L -c %i /proc/self/ns/net)
    setpriv --reuid 65534 --regid 65534 --clear-groups --no-new-privs -- sleep 60 &
    pids+=($!)
    as_nobody sh -c "echo ${pids[-1]} >'$work/host/rdmakit-l-$ns-$port'"
    start=$(date +%s%N)
    as_svc timeout 60 "$py" "$shapes/client.py" "$port" 1 $size \
      >"$work/c.out" 2>&1 || fail "client: $(cat "$work/c.out")"
    ms=$((($(date +%s%N) - start) / 1000000))
    wait "${pids[0]}" || fail "server: $(cat "$work/s.out")"
    tail -n 1 "$work/c.out" | grep -q '^OK' || fail "client: $(cat "$work/c.out")"
    grep -qE "connect fd=[0-9]+ .*path=kernel reason=.*belongs to uid 65534, which owns no socket listening" "$log" ||
      fail "the client believed the forged registration"
    [ "$ms" -lt 3000 ] || fail "the client took $ms ms"
    echo "OK forged-registration: not offered, kernel TCP in $ms ms"
    ;;
  *) fail "unknown case" ;;
esac
