#!/usr/bin/env bash
# rdmakit-stat against real preloaded programs on loopback (docs/stat.md):
#   stat_test.sh CASE RUN STAT
#   live    iperf3 -P 2 and redis-benchmark, both ends preloaded, at once:
#           every connection listed mid-run with path shm; the byte counts
#           against what the programs report (iperf3's own counts, redis's
#           INFO stats), within what was in flight.
#   kernel  one end preloaded (each way): the connection listed with path
#           kernel, its reason and no byte counts; gone once closed.
#   hostile statistics files with bad magic, size, counts, pid, owner, a
#           FIFO, a symlink, control characters: skipped or shown printable.
# The statistics files go to a private directory (RDMAKIT_PRELOAD_STAT_DIR),
# so other tests running at the same time are not seen.
set -euo pipefail
case_name=$1 run=$(realpath "$2") stat=$(realpath "$3")
work=$(mktemp -d /tmp/rdmakit-stat-test.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL [$case_name]: $*" >&2; exit 1; }
need() { command -v "$1" >/dev/null || fail "$1 is not installed (scripts/deps.sh installs it)"; }
export RDMAKIT_PRELOAD_DIR=$work/rdv RDMAKIT_PRELOAD_STAT_DIR=$work/stat
mkdir -m 700 "$RDMAKIT_PRELOAD_DIR" "$RDMAKIT_PRELOAD_STAT_DIR"
pre=("$run" --log "$work/log")
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_listen() {
  for _ in $(seq 400); do ss -ltn "sport = :$1" | grep -q LISTEN && return 0; sleep 0.05; done
  fail "no server listening on port $1 after 20 s"
}

case "$case_name" in
  live)
    need iperf3; need redis-server; need redis-benchmark; need redis-cli
    iport=$(free_port); rport=$(free_port)
    "${pre[@]}" timeout 150 iperf3 -s -p "$iport" >"$work/is.out" 2>&1 &
    pids+=($!)
    "${pre[@]}" timeout 150 redis-server --port "$rport" --bind 127.0.0.1 --save "" \
      --appendonly no --dir "$work" --daemonize no >"$work/rs.out" 2>&1 &
    pids+=($!)
    wait_listen "$iport"; wait_listen "$rport"
    "${pre[@]}" timeout 40 iperf3 -c 127.0.0.1 -p "$iport" -P 2 -t 4 -J >"$work/ic.json" 2>"$work/ic.err" &
    iperf_pid=$!
    "${pre[@]}" timeout 130 redis-benchmark -p "$rport" -t set,get -n 200000 -c 10 -q \
      >"$work/rb.out" 2>&1 &
    bench_pid=$!
    # A sample every 0.2 s until both clients are done (the iperf3 client's
    # last sample bounds its counts from below).
    "$stat" --json --watch 0.2 --count 300 >"$work/watch.jsonl" 2>"$work/watch.err" &
    watch_pid=$!; pids+=("$watch_pid")
    # Mid-run: both clients with all their connections, every one on shm.
    ok=0
    for _ in $(seq 100); do
      "$stat" --json >"$work/mid.json"
      if python3 - "$work/mid.json" <<'PY'; then ok=1; break; fi
import json, sys
s = json.load(open(sys.argv[1]))
procs = s["processes"]
def conns(prog, side):
    return [c for p in procs if p["program"] == prog for c in p["connections"]
            if c["side"] == side and c["state"] == "live"]
ic, is_ = conns("iperf3", "connect"), conns("iperf3", "accept")
rb, rs = conns("redis-benchmark", "connect"), conns("redis-server", "accept")
moving = sum(1 for c in ic if (c["tx_bytes"] or 0) > 1 << 20)
sys.exit(0 if len(ic) == 3 and len(is_) == 3 and moving == 2 and len(rb) >= 10 and len(rs) >= 10 else 1)
PY
      sleep 0.1
    done
    [ "$ok" = 1 ] || fail "mid-run listing incomplete: $(cat "$work/mid.json")"
    python3 - "$work/mid.json" <<'PY' || fail "mid-run listing: $(cat "$work/mid.json")"
import json, sys
s = json.load(open(sys.argv[1]))
n = 0
for p in s["processes"]:
    for c in p["connections"]:
        if c["state"] != "live":
            continue
        n += 1
        assert c["path"] == "shm", c
        assert c["tx_bytes"] is not None and c["ring_bytes"] > 0, c
        assert c["local"] != "?" and c["peer"] != "?", c
    assert p["fallbacks"] == 0, p
    assert p["upgrades"]["shm"] >= len([c for c in p["connections"] if c["state"] == "live"]), p
print(f"mid-run: {n} live connections, all on shm, in {len(s['processes'])} processes")
PY
    wait "$iperf_pid" || fail "iperf3 client: $(tail -n 20 "$work/ic.err" "$work/ic.json")"
    wait "$bench_pid" || fail "redis-benchmark: $(tail -n 5 "$work/rb.out")"
    # Server side, after the clients closed: the iperf3 server's data
    # connections (closed, still in their slots) and redis's own counters.
    "${pre[@]}" timeout 10 redis-cli -p "$rport" INFO stats | tr -d '\r' >"$work/info"
    sleep 0.3  # redis-cli's connection closed on the server too
    "$stat" --json --closed >"$work/end.json"
    kill "$watch_pid" 2>/dev/null || true
    python3 - "$work/ic.json" "$work/end.json" "$work/watch.jsonl" "$work/info" <<'PY' ||
import json, sys
ic = json.load(open(sys.argv[1]))
end = json.load(open(sys.argv[2]))
sent = ic["end"]["sum_sent"]["bytes"]
received = ic["end"]["sum_received"]["bytes"]
# iperf3 server: its two data connections (the control connection is the
# smallest), closed now, with their final counts.
srv = [p for p in end["processes"] if p["program"] == "iperf3"]
assert len(srv) == 1, "the iperf3 server (alone) should be listed"
data = sorted((c for c in srv[0]["connections"] if c["path"] == "shm"),
              key=lambda c: c["rx_bytes"])[-2:]
rx = sum(c["rx_bytes"] for c in data)
print(f"iperf3: client sent {sent}, server reported {received}, rdmakit-stat counted {rx} "
      f"received ({len(srv[0]['connections'])} server connections listed)")
assert all(c["state"] == "closed" for c in data), data
# What the server read: at least what it reported, at most what was sent,
# plus the 37-byte cookie each data connection opens with (iperf3 does not
# count it).
cookies = 2 * 37
assert received + cookies <= rx <= sent + cookies, (received, rx, sent)
# The client's last sample while it ran: its data connections' counts (the
# control connection, the smallest, left out; each data connection's cookie
# counted) below the final ones, and not far (a sample every 0.2 s of a 4 s
# run; one taken after the last write sees them all).
last = None
for line in open(sys.argv[3]):
    s = json.loads(line)
    for p in s["processes"]:
        cs = [c for c in p["connections"] if p["program"] == "iperf3" and c["side"] == "connect"]
        if len(cs) == 3:
            last = sum(sorted(c["tx_bytes"] for c in cs)[-2:])
assert last is not None, "no sample of the iperf3 client"
print(f"iperf3 client: last sample {last} of {sent} bytes sent")
assert sent // 2 <= last <= sent + cookies, (last, sent)
# redis: the server's totals (closed + live connections) against INFO.
info = dict(l.split(":", 1) for l in open(sys.argv[4]).read().split("\n") if ":" in l)
rin, rout = int(info["total_net_input_bytes"]), int(info["total_net_output_bytes"])
rs = [p for p in end["processes"] if p["program"] == "redis-server"]
assert len(rs) == 1
t = rs[0]["totals"]
print(f"redis: INFO in {rin} out {rout}; rdmakit-stat rx {t['rx_bytes']} tx {t['tx_bytes']}")
# Input: the same reads (INFO's own request included). Output: the INFO
# reply itself is written after its figures were taken.
assert t["rx_bytes"] == rin, (t["rx_bytes"], rin)
assert rout < t["tx_bytes"] <= rout + 64 * 1024, (t["tx_bytes"], rout)
assert rs[0]["fallbacks"] == 0
PY
      fail "byte counts do not match"
    ;;
  kernel)
    # A preloaded server with a plain client, then a preloaded client with a
    # plain server: each connection stays on kernel TCP and is listed with
    # its reason, without byte counts; once closed it is no longer live.
    for who in server client; do
      port=$(free_port)
      srv=(); cli=()
      [ "$who" = server ] && srv=("${pre[@]}")
      [ "$who" = client ] && cli=("${pre[@]}")
      rm -f "$work/go"
      "${srv[@]}" timeout 30 python3 -c '
import os, socket, sys, time
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", int(sys.argv[1]))); l.listen(4)
c, _ = l.accept(); c.sendall(b"x" * 1000)
while not os.path.exists(sys.argv[2]): time.sleep(0.05)
c.close()
time.sleep(30)' "$port" "$work/go" >"$work/s.out" 2>&1 &
      spid=$!; pids+=("$spid")
      wait_listen "$port"
      "${cli[@]}" timeout 30 python3 -c '
import os, socket, sys, time
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
n = 0
while n < 1000: n += len(c.recv(4096))
while not os.path.exists(sys.argv[2]): time.sleep(0.05)
c.close()
time.sleep(30)' "$port" "$work/go" >"$work/c.out" 2>&1 &
      cpid=$!; pids+=("$cpid")
      ok=0
      for _ in $(seq 100); do
        "$stat" --json >"$work/k.json"
        grep -q '"path":"kernel"' "$work/k.json" && { ok=1; break; }
        sleep 0.1
      done
      [ "$ok" = 1 ] || fail "$who preloaded: no kernel connection listed: $(cat "$work/k.json")"
      "$stat" >"$work/k.txt"
      cat "$work/k.txt"
      python3 - "$work/k.json" "$who" "$port" <<'PY' || fail "$who preloaded: $(cat "$work/k.json")"
import json, sys
s = json.load(open(sys.argv[1])); who = sys.argv[2]; port = sys.argv[3]
live = [(p, c) for p in s["processes"] for c in p["connections"] if c["state"] == "live"]
assert len(live) == 1, live
p, c = live[0]
assert p["program"] == "python3" and c["path"] == "kernel", c
assert c["tx_bytes"] is None and c["rx_bytes"] is None, c
assert p["fallbacks"] == 1 and p["upgrades"]["shm"] == 0, p
want = "no rendezvous offer from the peer" if who == "server" else f"no rdmakit listener on port {port}"
assert c["reason"].startswith(want), c["reason"]
assert p["fallback_reasons"][0]["reason"].startswith(want), p["fallback_reasons"]
assert c["side"] == ("accept" if who == "server" else "connect"), c
assert c["local"].endswith(":" + port) if who == "server" else c["peer"].endswith(":" + port), c
print(f"{who} preloaded: listed path=kernel reason={c['reason']}")
PY
      grep -q "kernel .*no r" "$work/k.txt" || fail "table: $(cat "$work/k.txt")"
      touch "$work/go"  # both close
      ok=0
      for _ in $(seq 100); do
        "$stat" --json >"$work/k2.json"
        grep -q '"state":"live"' "$work/k2.json" || { ok=1; break; }
        sleep 0.1
      done
      [ "$ok" = 1 ] || fail "$who preloaded: still listed after close: $(cat "$work/k2.json")"
      kill "$spid" "$cpid" 2>/dev/null || true
      wait "$spid" "$cpid" 2>/dev/null || true
    done
    # The files of the processes killed above: gone (their atexit did not
    # run under SIGTERM) are stale, and the tool removes them (ours).
    "$stat" --json >"$work/k3.json"
    ls "$RDMAKIT_PRELOAD_STAT_DIR" | grep -q . && fail "stale files left: $(ls "$RDMAKIT_PRELOAD_STAT_DIR")"
    echo "stale files removed: $(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["removed_stale"]))' "$work/k3.json")"
    ;;
  hostile)
    # Files another user could write into their own statistics file (or
    # plant under a name): the reader must skip each with a reason, never
    # hang or crash, and show nothing unprintable.
    d=$RDMAKIT_PRELOAD_STAT_DIR
    sleeps=()
    for _ in 1 2 3 4 5 6 7; do sleep 60 & sleeps+=($!); pids+=($!); done
    python3 - "$d" "$(id -u)" "${sleeps[@]}" <<'PY'
import os, struct, sys
d, uid = sys.argv[1], int(sys.argv[2]); p = [int(x) for x in sys.argv[3:]]
SIZE = 4096 + 320 * 1024
def header(pid, magic=b"RKSTAT1\0", version=1, slots=1024, program=b"\x1b[31mevil\x07" + b"A" * 40):
    h = bytearray(4096)
    struct.pack_into("<8sIIIIiIQ", h, 0, magic, version, 4096, 320, slots, pid, 16, 0)
    h[40:72] = program[:32]                       # no NUL: cut at the array's end
    struct.pack_into("<9Q", h, 72, 1, 2, 3, 2**63, 5, 6, 7, 8, 9)
    struct.pack_into("<Q", h, 144, 10**18); h[152:272] = (b"\x1b]0;title\x07" + b"R" * 120)[:120]
    return h
def slot(state=2, gen=1, gen_end=1, path=4):
    s = bytearray(320)
    struct.pack_into("<IIiBBBBQQII", s, 0, state, gen, 7, path, 2, 1, 0, 1, 0, 2**32 - 1, gen_end)
    s[40:88] = b"L" * 48; s[88:136] = b"\x1b[2J" + b"P" * 44; s[136:248] = b"X" * 112
    struct.pack_into("<5Q", s, 256, 2**64 - 1, 1, 2, 3, 4)
    return s
def write(pid, data, name_uid=uid):
    with open(f"{d}/rdmakit-stat-{name_uid}-{pid}", "wb") as f: f.write(data)
# 1: valid layout, hostile contents: one good slot, one of an unknown path,
# one torn (gen != gen_end), one in an unknown state.
body = header(p[0]) + slot() + slot(path=99) + slot(gen=2, gen_end=3) + slot(state=77)
write(p[0], body + bytes(SIZE - len(body)))
write(p[1], header(p[1], magic=b"XXXXXXXX") + bytes(SIZE - 4096))   # bad magic
write(p[2], header(p[2]) + bytes(100))                               # truncated
write(p[3], header(p[3], slots=2**32 - 1) + bytes(SIZE - 4096))     # impossible count
write(p[4], header(p[5]) + bytes(SIZE - 4096))                       # pid not its name's
os.mkfifo(f"{d}/rdmakit-stat-{uid}-{p[5]}")                          # a FIFO
os.symlink("/etc/passwd", f"{d}/rdmakit-stat-{uid}-{p[6]}")          # a symlink
write(p[6] + 1000000, b"junk", name_uid=uid + 1)                     # owner not its name's
write("x", b"junk")                                                  # not a name of ours
PY
    timeout 10 "$stat" --json --no-clean >"$work/h.json" || fail "rdmakit-stat failed or hung on hostile files"
    timeout 10 "$stat" --no-clean >"$work/h.txt" 2>"$work/h.err" || fail "table mode failed"
    cat "$work/h.txt" "$work/h.err"
    LC_ALL=C grep -q $'[\x01-\x08\x0b-\x1f\x7f]' "$work/h.txt" "$work/h.err" && fail "control characters printed"
    python3 - "$work/h.json" "${sleeps[@]}" <<'PY' || fail "hostile files: $(cat "$work/h.json")"
import json, sys
s = json.load(open(sys.argv[1])); p = [int(x) for x in sys.argv[2:]]
assert len(s["processes"]) == 1, s["processes"]
pr = s["processes"][0]
assert pr["pid"] == p[0] and len(pr["connections"]) == 1, pr
assert all(32 <= ord(ch) < 127 for ch in json.dumps(pr, ensure_ascii=False)), "unprintable text"
c = pr["connections"][0]
assert c["path"] == "kernel" and c["tx_bytes"] is None and len(c["reason"]) == 112, c
assert len(pr["program"]) == 32 and len(c["local"]) == 48, pr
why = sorted(x["why"] for x in s["skipped"])
print("skipped:", why)
assert len(why) == 7, why
for w in ("bad magic", "size ", "unknown layout", "not the pid in its name", "not a regular file",
          "symbolic links", "owner uid"):
    assert any(x.startswith(w) or w in x for x in why), (w, why)
PY
    ;;
  *) fail "unknown case" ;;
esac
echo "PASS [$case_name]"
