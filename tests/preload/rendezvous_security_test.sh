#!/usr/bin/env bash
# Attacks on the cross-host rendezvous (src/preload/remote_serve.cpp,
# docs/preload.md "Bounds" and "Shared secret") between two network-namespace
# hosts, streams on the tcp provider (no RDMA device needed):
#   rendezvous_security_test.sh CASE RUN FLOOD
#   offer-flood  another Unix user floods the server's rendezvous with
#                offers from two addresses: the server's descriptors stay
#                within the bounds, a genuine preloaded client still upgrades
#                (during a second flood too) with its bytes verified, and the
#                held offers are reclaimed when they time out.
#   secret       a right-secret pair upgrades; a wrong secret, a missing one
#                on either side and an unauthenticated flood stay on kernel
#                TCP with their reason, every byte intact, nothing stored.
# Root only (network namespaces, a second user). Every wait is bounded.
set -euo pipefail
case_name=$1 run=$(realpath "$2") flood_bin=$(realpath "$3")
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/rdmakit-rdv-sec.XXXXXX)
pids=()
ns_a=rksa$$ ns_b=rksb$$
cleanup() {
  set +e  # best effort: nothing here decides the result
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  ip netns del "$ns_a" 2>/dev/null || true
  ip netns del "$ns_b" 2>/dev/null || true
  type second_user_remove >/dev/null 2>&1 && second_user_remove
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL [$case_name]: $*" >&2; [ -f "$work/log" ] && sed 's/^/  log: /' "$work/log" >&2; exit 1; }
[ "$(id -u)" = 0 ] || fail "needs root (network namespaces, a second user)"
export RDMAKIT_PRELOAD_DIR=$work/rdv
mkdir -m 700 "$RDMAKIT_PRELOAD_DIR"
export RDMAKIT_PRELOAD_REMOTE_PROVIDER=tcp
unset RDMAKIT_SECRET RDMAKIT_SECRET_FILE
log=$work/log
: >"$log"
count() { grep -cE "$1" "$log" 2>/dev/null || true; }
expect_count() {  # N PATTERN WHAT
  local n; n=$(count "$2")
  [ "$n" = "$1" ] || fail "expected $1 $3, found $n"
}

# Two hosts: A (server) 10.251.79.1; B (clients) 10.251.79.2, and .3/.4
# for the flood.
. "$here/../support/two_hosts.sh"
two_hosts_up "$ns_a" "$ns_b" 10.251.79 3 4

# The flooder runs as another Unix user: its binary must be reachable.
. "$here/../support/second_user.sh"
second_user_create || fail "no second user"
trap cleanup EXIT  # second_user_create set its own; cleanup removes the user too
chmod 711 "$work"
mkdir -m 755 "$work/bin"
cp "$flood_bin" "$work/bin/flood" && chmod 755 "$work/bin/flood"
flood() {  # in B, as the second user
  in_b bash -c '. "$0"; as_second_user "$@"' "$here/../support/second_user.sh" \
    "$work/bin/flood" "$@"
}

port=5400
# A preloaded threaded echo server on A, on a port of its own (the last
# one's may still be closing); its pid in $work/spid.
start_server() {  # env assignments...
  rm -f "$work/spid"
  port=$((port + 1))
  in_a env "$@" "$run" --log "$log" timeout 60 python3 - $port "$work/spid" >"$work/s.out" 2>&1 <<'PY' &
import os, socket, sys, threading
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("10.251.79.1", int(sys.argv[1]))); l.listen(64)
open(sys.argv[2], "w").write(f"{os.getpid()}\n")
def serve(c):
    while True:
        b = c.recv(65536)
        if not b: break
        c.sendall(b)
    c.close()
while True:
    c, _ = l.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
PY
  server_pid=$!; pids+=("$server_pid")
  wait_listen_ns $port; wait_listen_ns $((port + 10000))
  for _ in $(seq 100); do [ -s "$work/spid" ] && break; sleep 0.05; done
  [ -s "$work/spid" ] || fail "echo server: $(cat "$work/s.out")"
  spid=$(cat "$work/spid")
}
stop_server() { kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; }
fds() { ls "/proc/$spid/fd" | wc -l; }
# A preloaded client on B: 300 kB each way, every byte checked.
client() {  # env assignments...
  in_b env "$@" "$run" --log "$log" timeout 30 python3 - $port >>"$work/c.out" 2>&1 <<'PY' ||
import socket, sys
data = bytes((i * 7 + 3) & 0xff for i in range(300000))
s = socket.create_connection(("10.251.79.1", int(sys.argv[1])), timeout=20)
s.sendall(data); s.shutdown(socket.SHUT_WR)
echo = b""
while True:
    b = s.recv(65536)
    if not b: break
    echo += b
if echo != data: sys.exit(f"echo of {len(echo)} bytes differs from the {len(data)} sent")
print("300000 bytes each way intact")
PY
    fail "client: $(cat "$work/c.out")"
}
wait_line() {  # FILE PATTERN: up to 30 s
  for _ in $(seq 600); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.05; done
  fail "no '$2' in $1: $(cat "$1")"
}

case "$case_name" in
  offer-flood)
    # At most 24 offers held in total (16 per source by default), and a
    # 2 s budget so that held offers expire within 3 s.
    start_server RDMAKIT_PRELOAD_OFFERS_MAX=24 RDMAKIT_PRELOAD_TIMEOUT_MS=2000
    client  # first, so the stream engine's descriptors are in the base
    base=$(fds)
    t0=$(date +%s)
    flood 10.251.79.1 $((port + 10000)) $port 300 30000 10.251.79.3,10.251.79.4 >"$work/f1.out" 2>&1 &
    f1=$!; pids+=("$f1")
    wait_line "$work/f1.out" "^flooded:"
    most=$(( $(date +%s) - t0 + 3 ))  # a line a second, the first and the burst's end
    cat "$work/f1.out"
    held=$(( $(fds) - base ))
    echo "server descriptors: $base before the flood, +$held with 300 offers held by the flooder"
    [ "$held" -le 28 ] || fail "the server holds $held more descriptors after the flood (bound 24)"
    [ "$held" -ge 16 ] || fail "the flood reached only $held entries (the case tests nothing)"
    grep -q "stored 300" "$work/f1.out" || fail "the flood's offers were not all stored: $(cat "$work/f1.out")"
    evict=$(count "offer evicted|handshake evicted")
    [ "$evict" -ge 1 ] && [ "$evict" -le "$most" ] ||
      fail "expected 1..$most rate-limited eviction lines, found $evict"
    # A genuine client from another address of B, while the flood holds.
    client
    # The flooder still holds its connections: the offers time out (budget
    # + 1 s) and their descriptors are reclaimed.
    ok=0
    for _ in $(seq 100); do [ $(( $(fds) - base )) -le 4 ] && { ok=1; break; }; sleep 0.1; done
    [ "$ok" = 1 ] || fail "expired offers not reclaimed: $(( $(fds) - base )) descriptors above the base"
    kill -0 "$f1" 2>/dev/null || fail "the flooder ended before the expiry check"
    echo "expired offers reclaimed while the flooder still held its connections"
    kill "$f1" 2>/dev/null || true
    # Genuine clients during a second flood.
    flood 10.251.79.1 $((port + 10000)) $port 300 1000 10.251.79.3,10.251.79.4 >"$work/f2.out" 2>&1 &
    f2=$!; pids+=("$f2")
    client; client
    wait "$f2" || fail "second flood: $(cat "$work/f2.out")"
    cat "$work/f2.out"
    expect_count 4 "python3\]: connect fd=.*local=10.251.79.2:[0-9]+ peer=10.251.79.1:$port path=tcp" \
      "genuine client connections upgraded"
    expect_count 4 "python3\]: accept fd=.*peer=\[?(::ffff:)?10.251.79.2\]?:[0-9]+ path=tcp" \
      "genuine server connections upgraded"
    expect_count 0 "path=kernel" "fallbacks"
    stop_server
    ;;
  secret)
    s1=preload-test-secret-one-0123456789
    s2=preload-test-secret-two-0123456789
    printf '%s\n' "$s1" >"$work/key" && chmod 600 "$work/key"
    # Right secret (a key file on one side, the variable on the other).
    start_server RDMAKIT_SECRET_FILE="$work/key"
    client RDMAKIT_SECRET="$s1"
    expect_count 1 "connect fd=.*path=tcp" "right-secret client upgraded"
    expect_count 1 "accept fd=.*path=tcp" "right-secret server upgraded"
    : >"$log"
    # Wrong secret; no secret on the client.
    client RDMAKIT_SECRET="$s2"
    expect_count 1 "connect fd=.*path=kernel reason=.*could not prove the shared secret" \
      "wrong-secret client fallbacks"
    client
    expect_count 1 "connect fd=.*path=kernel reason=.*requires the shared secret and none is configured here" \
      "no-secret client fallbacks"
    expect_count 2 "accept fd=.*path=kernel reason=.*no rendezvous offer from the peer" \
      "server fallbacks without an offer"
    expect_count 0 "path=tcp" "upgrades without the secret"
    : >"$log"
    # An unauthenticated flood: nothing is stored, refusals are rate-limited,
    # and the right-secret client still upgrades.
    base=$(fds)
    t0=$(date +%s)
    flood 10.251.79.1 $((port + 10000)) $port 200 0 10.251.79.3 >"$work/f.out" 2>&1 ||
      fail "flood: $(cat "$work/f.out")"
    # At most a line a second (plus the first and the end of the burst),
    # however long a loaded machine takes for the flood.
    most=$(( $(date +%s) - t0 + 3 ))
    cat "$work/f.out"
    grep -q "stored 0, refused 200, closed 0, secret exchanges 200" "$work/f.out" ||
      fail "unauthenticated offers were stored: $(cat "$work/f.out")"
    refusals=$(count "did not prove the shared secret")
    [ "$refusals" -ge 1 ] && [ "$refusals" -le "$most" ] ||
      fail "expected 1..$most rate-limited refusal lines, found $refusals"
    client RDMAKIT_SECRET="$s1"
    expect_count 1 "connect fd=.*path=tcp" "right-secret client upgraded after the flood"
    [ $(( $(fds) - base )) -le 3 ] || fail "the refused flood left $(( $(fds) - base )) descriptors"
    stop_server
    : >"$log"
    # A secret on the client only: the server does not authenticate.
    start_server
    client RDMAKIT_SECRET="$s1"
    expect_count 1 "connect fd=.*path=kernel reason=.*does not authenticate" \
      "client fallbacks against an unauthenticated server"
    stop_server
    ;;
  *) fail "unknown case" ;;
esac
echo "PASS [$case_name]"
