#!/usr/bin/env bash
# One process connected to its own listener, preloaded (docs/preload.md,
# "Process shapes"): each end's first use would wait for the other's, which
# the same thread makes next.
#   self_connect_test.sh SHAPE RUN
# SHAPE is one of tests/preload/shapes/self_connect.py's. Every byte is
# checked; no first use may wait out the rendezvous budget (5 s here: the
# slowest first use must stay under 1 s); the log must show both ends of
# every connection on shm, except write-before-accept, whose connection must
# stay on kernel TCP with the reason logged (nothing accepted it yet).
set -euo pipefail
shape=$1 run=$(realpath "$2")
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/rdmakit-self.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL [$shape]: $*" >&2; sed 's/^/  log: /' "$work/log" >&2 2>/dev/null || true; exit 1; }
export RDMAKIT_PRELOAD_DIR=$work/rdv
mkdir -m 700 "$RDMAKIT_PRELOAD_DIR"
log=$work/log
"$run" --timeout 5000 --log "$log" timeout 60 python3 "$here/shapes/self_connect.py" "$shape" \
  >"$work/out" 2>&1 || fail "$(cat "$work/out")"
grep -q '^OK' "$work/out" || fail "$(cat "$work/out")"
conns=$(sed -n 's/.*conns=\([0-9]*\).*/\1/p' "$work/out")
slowest=$(sed -n 's/.*slowest_first_use_ms=\([0-9.]*\).*/\1/p' "$work/out")
awk -v s="$slowest" 'BEGIN { exit !(s < 1000) }' ||
  fail "a first use waited ${slowest} ms (the rendezvous budget is 5000 ms)"
count() { grep -cE "$1" "$log" || true; }
expect() {  # N PATTERN WHAT
  local n; n=$(count "$2")
  [ "$n" = "$1" ] || fail "expected $1 $3, found $n"
}
if [ "$shape" = write-before-accept ]; then
  expect 1 "connect fd=[0-9]+ .*path=kernel reason=the listener is in this process and has not accepted" \
    "client end on kernel TCP, with its reason"
  expect 1 "accept fd=[0-9]+ .*path=kernel" "accepted end on kernel TCP"
  expect 0 "path=shm|path=none" "ends on another path"
else
  expect "$conns" "connect fd=[0-9]+ .*path=shm" "client ends on shm"
  expect "$conns" "accept fd=[0-9]+ .*path=shm" "accepted ends on shm"
  expect 0 "path=kernel|path=none" "ends off the fast path"
fi
echo "$(cat "$work/out")"
