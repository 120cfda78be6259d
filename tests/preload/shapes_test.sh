#!/usr/bin/env bash
# Process shapes of real servers, preloaded at both ends on loopback:
#   shapes_test.sh SHAPE RUN
# SHAPE is one of tests/preload/shapes/server.py's: fork, double-fork,
# keep-copy, both-use, fork-after-use, exec, exec-after-use, exec-plain,
# exec-plain-after-use, scm-rights, signals, client-child-first,
# client-parent-first, client-child-exits, client-parent-closes (the client
# forks after its connect: client.py),
# close-all-from, close-all-range, close-all-loop (the server closes every
# descriptor it does not know of; run at a soft limit of 1024, as usual),
# child-answers (a child writes the answer, shuts down writing and exits; the
# parent, which read the request, holds its copy until the client closes).
# Every connection's bytes are checked (digest and echo), and the log must
# show how each one was carried: adopted (path=shm) by the process that
# serves it, or relayed through the process that carries it (path=relay).
# Never kernel TCP, never an error.
set -euo pipefail
shape=$1 run=$(realpath "$2")
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/rdmakit-shapes.XXXXXX)
server_pid=
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL [$shape]: $*" >&2; sed 's/^/  log: /' "$work/log" >&2 2>/dev/null || true; exit 1; }
export RDMAKIT_PRELOAD_DIR=$work/rdv
mkdir -m 700 "$RDMAKIT_PRELOAD_DIR"
log=$work/log
conns=5 size=300000
case $shape in close-all-*) ulimit -Sn 1024 ;; esac
"$run" --log "$log" timeout 60 python3 "$here/shapes/server.py" "$shape" "$work/port" $conns \
  >"$work/s.out" 2>&1 &
server_pid=$!
for _ in $(seq 200); do [ -s "$work/port" ] && break; sleep 0.05; done
[ -s "$work/port" ] || fail "server did not start: $(cat "$work/s.out")"
case $shape in client-*) export CLIENT_FORK=${shape#client-} ;; esac
"$run" --log "$log" timeout 60 python3 "$here/shapes/client.py" "$(cat "$work/port")" $conns $size \
  >"$work/c.out" 2>&1 || fail "client: $(cat "$work/c.out")"
wait "$server_pid" || fail "server: $(cat "$work/s.out")"
server_pid=
grep -q '^OK' "$work/s.out" || fail "server: $(cat "$work/s.out")"
tail -n 1 "$work/c.out" | grep -q '^OK' || fail "client: $(cat "$work/c.out")"
count() { grep -cE "$1" "$log" || true; }
expect() {  # N PATTERN WHAT
  local n; n=$(count "$2")
  [ "$n" = "$1" ] || fail "expected $1 $3, found $n"
}
if [ "$shape" = exec-plain ]; then
  # The program that serves is not preloaded: each client is told at once
  # and stays on kernel TCP, never waiting its rendezvous budget.
  expect $conns "connect fd=[0-9]+ .*path=kernel reason=the peer passes the connection to a program that is not preloaded" \
    "client connections told the server's program is not preloaded"
  expect $conns "accept fd=[0-9]+ .*path=kernel reason=passed across exec to a program whose environment has no LD_PRELOAD" \
    "server connections settled before the exec"
  expect 0 "path=shm|path=none|EOPNOTSUPP" "other paths"
  echo "OK $shape: $conns connections on kernel TCP, each client told at once"
  exit 0
fi
expect $conns "connect fd=[0-9]+ .*path=shm" "client connections on shm"
expect 0 "path=kernel|path=none|EOPNOTSUPP" "connections off the fast path"
case $shape in
  both-use)  # the parent used it first and carries it, the child is relayed
    expect $conns "accept fd=[0-9]+ .*path=shm" "server connections adopted"
    expect $conns "accept fd=[0-9]+ .*path=relay owner=[0-9]+" "server connections relayed"
    grep -c '^parent:[0-9]* child:[0-9]*$' "$work/c.out" | grep -qx $conns ||
      fail "each answer should end with the child's line: $(cat "$work/c.out")"
    ;;
  client-*)  # the process that connected carries it; its forked child is relayed
    expect $conns "connect fd=[0-9]+ .*path=relay owner=[0-9]+" "client connections relayed"
    ;;
  close-all-loop)  # the library's descriptors were among the numbers closed
    expect 1 "close\([0-9]+\) by the application: a descriptor of the library" \
      "refusal logged (once per process)"
    ;;
esac
# Who served each connection (client.py prints SHAPE:PID per connection).
servers=$(grep -oE '^[a-z]+:[0-9]+' "$work/c.out" | sort -u)
[ "$(echo "$servers" | wc -l)" -ge 1 ] || fail "no server named in $(cat "$work/c.out")"
for who in $servers; do
  pid=${who#*:} role=${who%%:*}
  case $shape in
    fork-after-use|exec-after-use|exec-plain-after-use|child-answers)  # the parent read first: it carries, the child relays
      grep -qE "^rdmakit-preload\[$pid [^]]*\]: (use|inherited|fork) fd=[0-9]+ .*path=relay owner=[0-9]+" "$log" ||
        fail "$role $pid did not relay"
      ;;
    *)  # the process that serves adopts the connection itself
      grep -qE "^rdmakit-preload\[$pid [^]]*\]: accept fd=[0-9]+ .*path=shm" "$log" ||
        fail "$role $pid did not adopt its connection"
      ;;
  esac
done
echo "OK $shape: $conns connections, $(echo "$servers" | wc -l) serving processes"
