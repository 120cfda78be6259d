#!/usr/bin/env bash
# The wait hooks' cost per call under two or more preload libraries
# (bench/preload_wait_cost.c): epoll_wait(.., 0) on a user-mode set of N
# upgraded connections (one readable) and epoll_ctl(MOD), in ns per call
# (minimum over batches, then over rounds that alternate the libraries),
# and with CALLGRIND=1 also in instructions per call (valgrind: exact, not
# disturbed by other load; locked instructions cost more than they count).
# Usage: bench/preload_wait_cost.sh [BUILD_DIR] LIB...
#   N=50 CALLS=2000 BATCHES=200 ROUNDS=3 CPU=1 CALLGRIND=0
set -u
cd "$(dirname "$0")/.."
build=build
if [ $# -gt 0 ] && [ -d "$1" ]; then build=$1; shift; fi
[ $# -gt 0 ] || { echo "usage: $0 [BUILD_DIR] LIB..." >&2; exit 2; }
run=$(realpath "$build/tools/rdmakit-run/rdmakit-run")
[ -x "$run" ] || { echo "missing $run (ninja -C $build rdmakit_preload rdmakit-run)" >&2; exit 1; }
n=${N:-50} calls=${CALLS:-2000} batches=${BATCHES:-200} rounds=${ROUNDS:-3} cpu=${CPU:-1}
tmp=$(mktemp -d /tmp/rdmakit-wait-cost.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export RDMAKIT_PRELOAD_DIR=$tmp/rdv
mkdir -m 700 "$RDMAKIT_PRELOAD_DIR"
cc -O2 -Wall -o "$tmp/cost" bench/preload_wait_cost.c || exit 1
declare -A wait ctl
for r in $(seq "$rounds"); do
  for lib in "$@"; do
    o=$(taskset -c "$cpu" timeout 120 "$run" --lib "$lib" "$tmp/cost" "$n" "$calls" "$batches") ||
      { echo "failed under $lib: $o" >&2; exit 1; }
    w=$(sed -n 's/.*epoll_wait \([0-9]*\) ns.*/\1/p' <<<"$o")
    c=$(sed -n 's/.*epoll_ctl \([0-9]*\) ns.*/\1/p' <<<"$o")
    [ -z "${wait[$lib]:-}" ] || [ "$w" -lt "${wait[$lib]}" ] && wait[$lib]=$w
    [ -z "${ctl[$lib]:-}" ] || [ "$c" -lt "${ctl[$lib]}" ] && ctl[$lib]=$c
  done
done
printf '| library | epoll_wait ns/call | epoll_ctl MOD ns/call |'
[ "${CALLGRIND:-0}" = 1 ] && printf ' epoll_wait instr/call | epoll_ctl instr/call |'
printf '\n|---|---|---|'
[ "${CALLGRIND:-0}" = 1 ] && printf -- '---|---|'
printf '\n'
for lib in "$@"; do
  printf '| %s | %s | %s |' "$lib" "${wait[$lib]}" "${ctl[$lib]}"
  if [ "${CALLGRIND:-0}" = 1 ]; then
    rm -f "$tmp"/cg.*
    "$run" --lib "$lib" valgrind --tool=callgrind --separate-threads=yes \
      --callgrind-out-file="$tmp/cg.%p" -q "$tmp/cost" "$n" 1000 5 >/dev/null 2>&1
    python3 - "$(ls -S "$tmp"/cg.*-01 | head -1)" <<'PY'
import re, sys
from collections import Counter
names, incl, calls, cur, cfn, pend = {}, Counter(), Counter(), None, None, None
def name(tag, line):
    m = re.match(tag + r"=\((\d+)\)(?: (.*))?", line)
    if not m: return line[len(tag) + 1:]
    if m.group(2): names[m.group(1)] = m.group(2)
    return names[m.group(1)]
for line in open(sys.argv[1], errors="replace"):
    line = line.rstrip("\n")
    if line.startswith("fn="): cur = name("fn", line)
    elif line.startswith("cfn="): cfn = name("cfn", line)
    elif line.startswith("calls="): pend = int(line.split("=")[1].split()[0])
    elif line[:1].isdigit() or line[:1] in "+-*":
        p = line.split()
        if len(p) < 2: continue
        if pend is not None:
            if cur != cfn: incl[cur] += int(p[1])
            calls[cfn] += pend; pend = None
        else:
            incl[cur] += int(p[1])
out = []
for f in ("epoll_wait", "epoll_ctl"):
    out.append("%.0f" % (incl[f] / calls[f]) if calls[f] else "n/a")
print(" %s | %s |" % tuple(out))
PY
  else
    printf '\n'
  fi
done
