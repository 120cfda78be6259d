#!/usr/bin/env bash
# The application keeps its descriptor limit (docs/preload.md, "Descriptors"):
# fd_limit_test.sh RUN CASE
#   default   both ends at a soft limit of 1,024 (hard above it, as a login
#             shell or a systemd service gets) hold 900 connections at once:
#             every one upgraded, each process sees its soft limit of 1,024
#             and its own descriptors stay below it (the library's live above)
#   raised    both raise their own soft limit to 2,048 with setrlimit and
#             hold 1,500 connections: they read back 2,048, every
#             connection upgraded
#   over      a client at 1,024 opens connections until the kernel refuses
#             one: EMFILE below its limit, as without the library
#   no-room   soft = hard = 1,024: the library keeps to the top half of the
#             numbers; 300 connections all work (the first upgraded, the
#             rest on kernel TCP with the reason), every byte checked, and
#             the programs' own numbers stay below 512
set -euo pipefail
run=$(realpath "$1") case_name=$2
work=$(mktemp -d /tmp/rdmakit-fdlimit.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "FAIL [fd-limit $case_name]: $*" >&2
  grep -v "path=shm" "$work/log" 2>/dev/null | head -20 | sed 's/^/  log: /' >&2
  exit 1
}
export RDMAKIT_PRELOAD_DIR=$work/rdv
mkdir -m 700 "$RDMAKIT_PRELOAD_DIR"
log=$work/log
: >"$log"
cat >"$work/pair.py" <<'PY'
import os, resource, socket, sys, time
role, portfile, n, raise_to = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if raise_to:
    resource.setrlimit(resource.RLIMIT_NOFILE, (raise_to, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
conns = []
if role == "server":
    ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen(4096)
    open(portfile + ".tmp", "w").write(str(ls.getsockname()[1])); os.rename(portfile + ".tmp", portfile)
    for i in range(n):
        c = ls.accept()[0]; conns.append(c)
        b = c.recv(1)
        if b != bytes([i % 251]): raise SystemExit("server: connection %d sent %r" % (i, b))
        c.sendall(bytes([(i * 7) % 251]))
else:
    deadline = time.time() + 20
    while not os.path.exists(portfile):
        if time.time() > deadline: raise SystemExit("client: no server")
        time.sleep(0.05)
    port = int(open(portfile).read())
    for i in range(n):
        c = socket.create_connection(("127.0.0.1", port)); conns.append(c)
        c.sendall(bytes([i % 251]))
        b = c.recv(1)
        if b != bytes([(i * 7) % 251]): raise SystemExit("client: connection %d answered %r" % (i, b))
top = max(c.fileno() for c in conns)
print(role, "ok", len(conns), "soft", soft, "top", top, flush=True)
PY
pair() {  # N RAISE: both ends, prints their summaries
  "$run" --log "$log" timeout 120 python3 "$work/pair.py" server "$work/port" "$1" "$2" \
    >"$work/s.out" 2>&1 &
  pids+=($!)
  "$run" --log "$log" timeout 120 python3 "$work/pair.py" client "$work/port" "$1" "$2" \
    >"$work/c.out" 2>&1 || fail "client: $(cat "$work/c.out")"
  wait "${pids[-1]}" || fail "server: $(cat "$work/s.out")"
}
field() { awk -v k="$2" '{for (i = 1; i < NF; i++) if ($i == k) print $(i + 1)}' "$1"; }
shm() { grep -cE "\]: $1 fd=[0-9]+ .*path=shm" "$log" || true; }
hard=$(ulimit -Hn)
case $case_name in
  default | raised)
    if [ "$hard" != unlimited ] && [ "$hard" -lt 16384 ]; then
      ulimit -Hn 16384 2>/dev/null || fail "needs a hard descriptor limit of 16,384 (is $hard)"
    fi
    ulimit -Sn 1024
    if [ "$case_name" = default ]; then n=900 raise=0 want_soft=1024; else n=1500 raise=2048 want_soft=2048; fi
    pair "$n" "$raise"
    [ "$(field "$work/s.out" soft)" = "$want_soft" ] || fail "server sees soft limit $(field "$work/s.out" soft), not $want_soft"
    [ "$(field "$work/c.out" soft)" = "$want_soft" ] || fail "client sees soft limit $(field "$work/c.out" soft), not $want_soft"
    [ "$(field "$work/s.out" top)" -lt "$want_soft" ] || fail "server's own descriptors reach $(field "$work/s.out" top)"
    [ "$(field "$work/c.out" top)" -lt "$want_soft" ] || fail "client's own descriptors reach $(field "$work/c.out" top)"
    [ "$(shm connect)" = "$n" ] && [ "$(shm accept)" = "$n" ] ||
      fail "expected $n connects and $n accepts on shm, found $(shm connect) and $(shm accept)"
    ! grep -qE "path=kernel|path=none" "$log" || fail "connections off the fast path"
    ;;
  no-room)
    ulimit -n 1024  # soft and hard
    pair 300 0
    up=$(shm connect)
    [ "$up" -ge 10 ] || fail "only $up connections upgraded"
    kernel=$(grep -cE "\]: connect fd=[0-9]+ .*path=kernel reason=." "$log" || true)
    [ $((up + kernel)) = 300 ] || fail "$up upgraded and $kernel on kernel TCP of 300"
    # The library kept to the top half: the programs' own numbers were not
    # pushed up by its descriptors.
    for who in s c; do
      top=$(field "$work/$who.out" top)
      [ "$top" -lt 512 ] || fail "$who: the program's descriptors reach $top (the library took lower numbers)"
    done
    ;;
  over)
    if [ "$hard" != unlimited ] && [ "$hard" -lt 16384 ]; then
      ulimit -Hn 16384 2>/dev/null || fail "needs a hard descriptor limit of 16,384 (is $hard)"
    fi
    cat >"$work/over.py" <<'PY'
import errno, os, resource, socket, sys, time
role, portfile = sys.argv[1], sys.argv[2]
if role == "server":
    resource.setrlimit(resource.RLIMIT_NOFILE, (4096, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen(4096)
    open(portfile + ".tmp", "w").write(str(ls.getsockname()[1])); os.rename(portfile + ".tmp", portfile)
    conns = []
    while True:
        c = ls.accept()[0]; conns.append(c); c.sendall(c.recv(1))
while not os.path.exists(portfile): time.sleep(0.05)
port = int(open(portfile).read()); conns = []
for i in range(2000):
    try:
        c = socket.create_connection(("127.0.0.1", port))
    except OSError as e:
        print("refused", len(conns), errno.errorcode.get(e.errno), "top", max(c.fileno() for c in conns))
        break
    conns.append(c); c.sendall(b"x")
    if c.recv(1) != b"x": raise SystemExit("connection %d: no echo" % i)
else:
    print("never refused", len(conns), "top", max(c.fileno() for c in conns))
PY
    ulimit -Sn 1024
    "$run" --log "$log" timeout 120 python3 "$work/over.py" server "$work/port" >"$work/s.out" 2>&1 &
    pids+=($!)
    "$run" --log "$log" timeout 120 python3 "$work/over.py" client "$work/port" >"$work/c.out" 2>&1 ||
      fail "client: $(cat "$work/c.out")"
    read -r what got code _ top <"$work/c.out"
    [ "$what" = refused ] && [ "$code" = EMFILE ] || fail "client: $(cat "$work/c.out")"
    [ "$top" -lt 1024 ] || fail "client's descriptors reach $top"
    [ "$got" -ge 1000 ] || fail "client refused at $got connections: the library took its numbers"
    echo "PASS [fd-limit over]: $(cat "$work/c.out")"
    exit 0
    ;;
  *) fail "unknown case" ;;
esac
echo "PASS [fd-limit $case_name]: $(cat "$work/s.out") / $(cat "$work/c.out"); $(shm connect) on shm"
