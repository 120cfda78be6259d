#!/usr/bin/env bash
# Lanes of rdmakit-cp (--lanes N) that the tree, sync and kill tests do not
# cover (those run with RDMAKIT_CP_TEST_LANES=N):
#   cp_lanes_test.sh BINARY join PROVIDER   a lane joining with a wrong token, and with
#                                           a token replayed after its copy: refused,
#                                           named, nothing written; a genuine copy after
#   cp_lanes_test.sh BINARY drop PROVIDER   one lane closed mid-copy (push and pull):
#                                           the copy fails naming the lane and its
#                                           peer; --resume then completes it
set -u
bin=${1:?binary}
mode=${2:?mode}
provider=${3:-tcp}
host=127.0.0.1
base=/dev/shm
[ -d "$base" ] && [ -w "$base" ] || base=${TMPDIR:-/tmp}
work=$(mktemp -d "$base/rdmakit-cp-lanes.XXXXXX")
server_pid=
cleanup() {
  [ -n "$server_pid" ] && kill -9 "$server_pid" 2>/dev/null
  wait 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
pass() { echo "ok: $*"; }
cp_() { timeout --kill-after=5 60 "$bin" -q --provider "$provider" -p "$port" "$@"; }
start_server() {  # start_server [SERVE OPTION...]
  rm -f "$work/port"
  "$bin" serve --root "$work/root" -p 0 --port-file "$work/port" --provider "$provider" \
    --bind "$host" "$@" 2>>"$work/server.log" &
  server_pid=$!
  for _ in $(seq 100); do [ -s "$work/port" ] && break; sleep 0.05; done
  port=$(cat "$work/port" 2>/dev/null) || { fail "server did not start"; exit 1; }
}
mkdir -p "$work/src/tree/many" "$work/root" "$work/pulled"
for i in $(seq 1 300); do echo "small $i" >"$work/src/tree/many/s$i"; done
for i in 1 2 3; do head -c $((i * 3 * 1024 * 1024 + i)) /dev/urandom >"$work/src/tree/big$i"; done
src=$work/src/tree
start_server

case $mode in
  join)
    # A wrong token (zeros) for lane 1: the join is refused, the copy fails
    # before anything is written.
    RDMAKIT_CP_TEST_LANE_TOKEN=zero cp_ --lanes 2 -r "$src" "$host:wrong" 2>"$work/err"
    rc=$?
    if [ $rc = 5 ] && grep -q "lane 1 of 2: server refused its join: join token for lane 1 refused" "$work/err" &&
       [ ! -e "$work/root/wrong" ] && grep -q "lane join refused" "$work/server.log"; then
      pass "a wrong join token is refused (exit 5), nothing written"
    else fail "wrong token: exit $rc"; cat "$work/err"; fi
    # A genuine copy keeps its lane 1 token; replayed by a later copy, after
    # the first one ended, it is refused.
    mkdir "$work/root/first"
    RDMAKIT_CP_TEST_SAVE_TOKEN=$work/token cp_ --lanes 2 -r "$src" "$host:first" 2>"$work/err"
    rc=$?
    if [ $rc = 0 ] && [ "$(stat -c %s "$work/token" 2>/dev/null)" = 32 ] &&
       diff -r "$src" "$work/root/first/tree" >/dev/null; then
      pass "a copy over 2 lanes, its token kept"
    else fail "first copy: exit $rc"; cat "$work/err"; fi
    RDMAKIT_CP_TEST_LANE_TOKEN=$work/token cp_ --lanes 2 -r "$src" "$host:replayed" 2>"$work/err"
    rc=$?
    if [ $rc = 5 ] && grep -q "server refused its join" "$work/err" && [ ! -e "$work/root/replayed" ]; then
      pass "a token replayed after its copy is refused (exit 5), nothing written"
    else fail "replayed token: exit $rc"; cat "$work/err"; fi
    # The same for a pull: refused, nothing received.
    RDMAKIT_CP_TEST_LANE_TOKEN=$work/token cp_ --lanes 2 -r "$host:first" "$work/pulled" 2>"$work/err"
    rc=$?
    if [ $rc = 5 ] && grep -q "server refused its join" "$work/err" && [ -z "$(ls -A "$work/pulled")" ]; then
      pass "pull: a replayed token is refused (exit 5), nothing received"
    else fail "pull with a replayed token: exit $rc"; cat "$work/err"; fi
    # The server still serves genuine copies.
    cp_ --lanes 4 -r "$host:first/tree" "$work/pulled" 2>"$work/err" &&
      diff -r "$src" "$work/pulled/tree" >/dev/null &&
      pass "a genuine 4-lane pull after the refusals" || fail "pull after the refusals"
    grep -q "lane join refused" "$work/server.log" && [ -z "$(ls -A "$work/root" | grep -v first)" ] &&
      pass "the refused joins are logged, nothing but the genuine copy in the root" ||
      fail "server log or root after the refusals"
    # The bound: --max-clients 1 gives one extra lane; a copy asking for 4
    # gets 2, and a copy meanwhile still gets its first.
    kill "$server_pid"; wait "$server_pid"; server_pid=
    start_server --max-clients 1
    out=$(cp_ --lanes 4 --json -r "$src" "$host:bounded" 2>"$work/err")
    if echo "$out" | grep -q '"lanes": 2' && diff -r "$src" "$work/root/bounded" >/dev/null &&
       grep -q "push admitted (1 copying) over 2 lanes" "$work/server.log"; then
      pass "--max-clients 1: a copy asking for 4 lanes gets 2"
    else fail "lane bound: $out"; cat "$work/err"; fi
    ;;
  drop)
    # --bwlimit stretches the copy so that lane 1 closes in the middle of it.
    for dir in push pull; do
      rm -rf "$work/root/d" "$work/pulled/tree"
      if [ $dir = push ]; then set -- -r "$src" "$host:d"; dest=$work/root/d/tree
      else mkdir -p "$work/root/d"; cp -a "$src" "$work/root/d/"; set -- -r "$host:d/tree" "$work/pulled"
        dest=$work/pulled/tree; fi
      RDMAKIT_CP_TEST_DROP_LANE=1 cp_ --lanes 3 --bwlimit 8M "$@" 2>"$work/err"
      rc=$?
      if [ $rc = 5 ] && grep -qE "lane 1 \(.+\)" "$work/err"; then
        pass "$dir: lane 1 closed mid-copy: exit 5, the lane and its peer named"
      else fail "$dir: dropped lane: exit $rc"; cat "$work/err"; fi
      if diff -r "$src" "$dest" >/dev/null 2>&1; then fail "$dir: the copy finished anyway"; fi
      cp_ --lanes 3 --resume "$@" 2>"$work/err" && diff -r "$src" "$dest" >/dev/null &&
        pass "$dir: --resume completes it" || { fail "$dir: resume"; cat "$work/err"; }
    done
    ;;
  *) echo "unknown mode $mode"; exit 2 ;;
esac
kill "$server_pid"; wait "$server_pid"; rc=$?; server_pid=
[ $rc = 0 ] && pass "server stopped cleanly" || fail "server exit $rc"
if grep -qE "Sanitizer|runtime error" "$work/server.log"; then fail "sanitizer report"; fi
[ $fails = 0 ] || { echo "$fails failure(s)"; tail -20 "$work/server.log"; exit 1; }
echo "all passed"
