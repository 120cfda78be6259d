#!/usr/bin/env bash
# More connections than one stream engine holds, between two preloaded
# processes: scale_test.sh RUN [N]. The client opens N concurrent
# connections (default 1,100; an engine holds 1,024 streams and the preload
# opens the next one 64 streams before that), then uses
# each in turn: one byte there, one back, every one checked. Every
# connection must take the shm path at both ends, and each process must
# have opened a second engine rather than fall back. The server then holds
# at most 7 descriptors per connection (docs/preload.md, "Ring size and
# memory per connection"), plus 100 of its own and its engines'.
set -euo pipefail
run=$(realpath "$1") n=${2:-1100}
work=$(mktemp -d /tmp/rdmakit-scale.XXXXXX)
server_pid=
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "FAIL [scale]: $*" >&2
  grep -v "path=shm" "$work/log" 2>/dev/null | head -20 | sed 's/^/  log: /' >&2
  exit 1
}
# The programs need n + 100 descriptors; the library's own (room for up to
# 9 per upgraded connection) go above that, in room it makes within the hard limit
# (docs/preload.md, "Interception").
need=$(((n + 100) * 9 + 4096))
hard=$(ulimit -Hn)
if [ "$hard" != unlimited ] && [ "$hard" -lt "$need" ]; then
  ulimit -Hn "$need" 2>/dev/null || fail "needs a hard limit of $need open files, it is $hard"
fi
ulimit -Sn $((n + 100))
export RDMAKIT_PRELOAD_DIR=$work/rdv
mkdir -m 700 "$RDMAKIT_PRELOAD_DIR"
log=$work/log
cat >"$work/pair.py" <<'PY'
import socket, sys
role, n = sys.argv[1], int(sys.argv[3])
def one(s):
    b = s.recv(1)
    if len(b) != 1: raise SystemExit("short read")
    return b
if role == "server":
    ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen(4096)
    open(sys.argv[2] + ".tmp", "w").write(str(ls.getsockname()[1]))
    import os; os.rename(sys.argv[2] + ".tmp", sys.argv[2])
    conns = [ls.accept()[0] for _ in range(n)]
    for i, c in enumerate(conns):
        b = one(c)
        if b[0] != i % 251: raise SystemExit("connection %d: byte %d" % (i, b[0]))
        c.sendall(bytes([(i * 7) % 251]))
    import os
    print("FDS", len(os.listdir("/proc/self/fd")))
    for c in conns: c.close()
    print("OK server", n)
else:
    port = int(open(sys.argv[2]).read())
    conns = [socket.create_connection(("127.0.0.1", port)) for _ in range(n)]
    for i, c in enumerate(conns):
        c.sendall(bytes([i % 251]))
        b = one(c)
        if b[0] != (i * 7) % 251: raise SystemExit("connection %d: answer %d" % (i, b[0]))
    for c in conns: c.close()
    print("OK client", n)
PY
"$run" --log "$log" timeout 120 python3 "$work/pair.py" server "$work/port" "$n" >"$work/s.out" 2>&1 &
server_pid=$!
for _ in $(seq 200); do [ -s "$work/port" ] && break; sleep 0.05; done
[ -s "$work/port" ] || fail "server did not start: $(cat "$work/s.out")"
start=$(date +%s%N)
"$run" --log "$log" timeout 120 python3 "$work/pair.py" client "$work/port" "$n" >"$work/c.out" 2>&1 ||
  fail "client: $(cat "$work/c.out")"
wait "$server_pid" || fail "server: $(cat "$work/s.out")"
server_pid=
ms=$((($(date +%s%N) - start) / 1000000))
count() { grep -cE "$1" "$log" || true; }
[ "$(count 'connect fd=[0-9]+ .*path=shm')" = "$n" ] || fail "$(count 'connect fd=[0-9]+ .*path=shm') of $n client connections on shm"
[ "$(count 'accept fd=[0-9]+ .*path=shm')" = "$n" ] || fail "$(count 'accept fd=[0-9]+ .*path=shm') of $n server connections on shm"
[ "$(count 'path=kernel|path=none')" = 0 ] || fail "connections off the fast path"
[ "$(count 'engine 2 on shm opened')" = 2 ] || fail "a second engine was not opened in both processes"
fds=$(sed -n 's/^FDS //p' "$work/s.out")
[ -n "$fds" ] && [ "$fds" -le $((7 * n + 100)) ] ||
  fail "the server held ${fds:-?} descriptors for $n connections (at most $((7 * n + 100)))"
echo "OK scale: $n concurrent connections on shm in $ms ms, a second engine in each process," \
  "$fds server descriptors"
