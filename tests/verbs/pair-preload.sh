#!/usr/bin/env bash
# Unmodified iperf3 and sockperf across two hosts under rdmakit-run: node0
# (this script with NODE=0) serves, node1 is the client. Every connection
# must be upgraded to a stream on verbs (the preload log's path=verbs on
# both sides, no path=kernel) and the bytes must match. Run by
# guest-tests.sh in the two Soft-RoCE VMs.
#   pair-preload.sh BUILD_DIR
#     iperf3 -P 1, iperf3 -R (the receiver's count identical in both
#     reports), sockperf ping-pong (no message dropped, duplicated or out of
#     order).
# Environment: SOFTROCE_NODE (0|1), SOFTROCE_IP, SOFTROCE_PEER_IP,
# SOFTROCE_PAIR_DIR (a directory both hosts see); PAIR_PRELOAD_PATH (default
# verbs: the path every connection must take). Every wait is bounded.
set -u
build=${1:?build dir}
node=${SOFTROCE_NODE:?}
self=${SOFTROCE_IP:?}
peer=${SOFTROCE_PEER_IP:?}
pair=${SOFTROCE_PAIR_DIR:?}
path=${PAIR_PRELOAD_PATH:-verbs}
run=$build/tools/rdmakit-run/rdmakit-run
work=$(mktemp -d "${TMPDIR:-/tmp}/pair-preload.XXXXXX")
server_pid=
trap '[ -z "$server_pid" ] || kill -9 "$server_pid" 2>/dev/null; rm -rf "$work"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
pass() { echo "ok: $* (at ${SECONDS} s)"; }
wait_for() {  # FILE SECONDS: the other node's signal
  local i
  for ((i = 0; i < $2 * 10; i++)); do [ -e "$1" ] && return 0; sleep 0.1; done
  fail "the other node never wrote $(basename "$1")"
  return 1
}
wait_listen() {
  local i
  for ((i = 0; i < 100; i++)); do ss -ltn "sport = :$1" | grep -q LISTEN && return 0; sleep 0.1; done
  fail "nothing listens on port $1"
  return 1
}
for p in iperf3 sockperf ss; do command -v $p >/dev/null || fail "$p is not installed (scripts/deps.sh)"; done
[ -x "$run" ] || fail "$run is not built"
[ $fails = 0 ] || exit 1
log=$work/log
# Emulated verbs connects in seconds, not milliseconds: a generous budget.
pre=("$run" --log "$log" --timeout 20000)
rm -f "$pair/preload."*".node$node"
iperf_port=5201 sp_port=11111

if [ "$node" = 0 ]; then
  for t in P1 R; do
    "${pre[@]}" timeout 60 iperf3 -s -1 -B "$self" -p $iperf_port -J >"$work/s-$t.json" 2>"$work/s-$t.err" &
    server_pid=$!
    wait_listen $iperf_port && touch "$pair/preload.iperf-$t.node0"
    wait "$server_pid"; rc=$?; server_pid=
    [ $rc = 0 ] && pass "iperf3 server ($t) exit 0" || { fail "iperf3 server ($t) exit $rc"; tail -n 5 "$work/s-$t.err"; }
    cp "$work/s-$t.json" "$pair/preload.s-$t.json.tmp" && mv "$pair/preload.s-$t.json.tmp" "$pair/preload.s-$t.json"
  done
  "${pre[@]}" timeout 60 sockperf sr --tcp -i "$self" -p $sp_port >"$work/sp.out" 2>&1 &
  server_pid=$!
  wait_listen $sp_port && touch "$pair/preload.sockperf.node0"
  wait_for "$pair/preload.done.node1" 50
  kill "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null; server_pid=
  want=$((2 * 2 + 1))  # iperf3: control + one stream, twice; sockperf: one
else
  for t in P1 R; do
    args=(-t 1); [ $t = R ] && args+=(-R)
    if wait_for "$pair/preload.iperf-$t.node0" 30; then
      "${pre[@]}" timeout 40 iperf3 -c "$peer" -p $iperf_port "${args[@]}" -J >"$work/c-$t.json" 2>"$work/c-$t.err" &&
        pass "iperf3 client ($t) exit 0" || { fail "iperf3 client ($t) exit $?"; tail -n 5 "$work/c-$t.err" "$work/c-$t.json"; }
    fi
  done
  if wait_for "$pair/preload.sockperf.node0" 30; then
    o=$work/sp-pp.out
    "${pre[@]}" timeout 30 sockperf pp --tcp -i "$peer" -p $sp_port -t 1 -m 64 >"$o" 2>&1 &&
      pass "sockperf ping-pong exit 0" || fail "sockperf ping-pong exit $?"
    grep -E "Summary:|dropped|ReceivedMessages" "$o"
    grep -q "# dropped messages = 0; # duplicated messages = 0; # out-of-order messages = 0" "$o" ||
      fail "sockperf: messages lost: $(tail -n 10 "$o")"
    grep -qE "\[Valid Duration\].*ReceivedMessages=[1-9]" "$o" || fail "sockperf: no replies"
  fi
  touch "$pair/preload.done.node1"
  # Both iperf3 runs' counts in one python3 (its start-up alone takes
  # seconds in an emulated guest).
  if wait_for "$pair/preload.s-R.json" 20; then
    python3 - "$work" "$pair" <<'PY' && pass "iperf3: byte counts match" || fail "iperf3: byte counts do not match"
import json, sys
ok = True
for t in ("P1", "R"):
    try:
        c = json.load(open(f"{sys.argv[1]}/c-{t}.json"))
        s = json.load(open(f"{sys.argv[2]}/preload.s-{t}.json"))
        cs, cr = c["end"]["sum_sent"]["bytes"], c["end"]["sum_received"]["bytes"]
        ss_, sr = s["end"]["sum_sent"]["bytes"], s["end"]["sum_received"]["bytes"]
    except (OSError, ValueError, KeyError) as e:
        print(f"iperf3 {t}: no report: {e}")
        ok = False
        continue
    # The receiver's count is the same in both reports (iperf3 exchanges
    # them at the end); the sender wrote at most its buffers' worth more.
    sent, received, same = (ss_, cr, ss_ == cs) if t == "R" else (cs, sr, sr == cr)
    good = same and 0 < received <= sent and sent - received <= 16 << 20
    print(f"iperf3 {t}: client sent={cs} received={cr}; server sent={ss_} received={sr}; "
          f"{c['end']['sum_received']['bits_per_second'] / 1e6:.1f} Mbit/s{'' if good else ' MISMATCH'}")
    ok = ok and good
sys.exit(0 if ok else 1)
PY
  fi
  want=$((2 * 2 + 1))  # iperf3: control + one stream, twice; sockperf: one
fi
side=$([ "$node" = 0 ] && echo accept || echo connect)
echo "--- preload log (node$node)"; cat "$log" 2>/dev/null
n=$(grep -cE "\]: $side fd=.* path=$path$" "$log" 2>/dev/null)
[ "$n" = "$want" ] && pass "$n connections ($side) on $path" || fail "expected $want connections ($side) on $path, found ${n:-0}"
k=$(grep -c "path=kernel" "$log" 2>/dev/null)
[ "${k:-0}" = 0 ] && pass "no kernel fallback" || fail "$k connections fell back to kernel TCP"
echo "pair-preload (node$node): $([ $fails = 0 ] && echo PASS || echo "$fails failed")"
exit $((fails > 0))
