#!/usr/bin/env bash
# What the statistics counters (rdmakit-stat) cost a preloaded connection's
# data path, isolated: bench/preload_path_cost.c (one thread, both ends of a
# connection to its own listener, upgraded to shm; 16-byte send and recv
# each way, so only the instructions of the path count, no cross-core
# transfer) under rdmakit-run with the counters on (the default) and off
# (RDMAKIT_PRELOAD_STAT=0), alternating, pinned to one CPU. Each run is the
# best of 10 x ITERS round trips; the table gives the median over the rounds
# and the ratio on / off. Kernel TCP in the same program is the baseline row.
# Usage: bench/preload_stat_cost.sh [BUILD_DIR]   (default: build)
#   RDMAKIT_BENCH_ROUNDS=15  RDMAKIT_BENCH_ITERS=200000  RDMAKIT_BENCH_CPU=1
# Writes bench/results/stat-cost-<UTC time>.md.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
rounds=${RDMAKIT_BENCH_ROUNDS:-15}
iters=${RDMAKIT_BENCH_ITERS:-200000}
cpu=${RDMAKIT_BENCH_CPU:-1}
run=$(realpath "$build/tools/rdmakit-run/rdmakit-run")
tmp=$(mktemp -d /tmp/rdmakit-statcost.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export RDMAKIT_PRELOAD_DIR=$tmp/rdv
mkdir -m 700 "$RDMAKIT_PRELOAD_DIR"
cc -O2 -Wall -o "$tmp/cost" bench/preload_path_cost.c
on=() off=() kernel=()
for r in $(seq "$rounds"); do
  kernel+=("$(taskset -c "$cpu" "$tmp/cost" $((iters / 10)) 10)")
  on+=("$(taskset -c "$cpu" "$run" --stats "$tmp/cost" "$iters" 10 2>"$tmp/on.log")")
  off+=("$(RDMAKIT_PRELOAD_STAT=0 taskset -c "$cpu" "$run" "$tmp/cost" "$iters" 10)")
  grep -q "summary connections shm=2 " "$tmp/on.log" || { echo "not on shm:"; cat "$tmp/on.log"; exit 1; }
  echo "round $r: kernel ${kernel[-1]} ns, counters on ${on[-1]} ns, off ${off[-1]} ns" >&2
done
stamp=$(date -u +%Y%m%d-%H%M%S)
out=bench/results/stat-cost-$stamp.md
python3 - "$out" "$stamp" "$rounds" "$iters" "$cpu" "$(cut -d' ' -f1-3 /proc/loadavg)" \
  "${kernel[*]}" "${on[*]}" "${off[*]}" <<'PY'
import statistics as st, sys
out, stamp, rounds, iters, cpu, load, k, on, off = sys.argv[1:]
k, on, off = ([float(x) for x in v.split()] for v in (k, on, off))
pairs = [a / b for a, b in zip(on, off)]
lines = [f"# Statistics counters: data-path cost, {stamp} UTC", "",
         f"`bench/preload_stat_cost.sh`: one thread, both ends of a loopback connection to its own "
         f"listener, 16-byte send and recv each way (no cross-core transfer: the path's instructions "
         f"only). Pinned to CPU {cpu}; {rounds} alternating rounds, each the best of 10 x {iters} "
         f"round trips. Load average at the end: {load}.", "",
         "| mode | ns per round trip (median) | min | max |", "|---|---|---|---|",
         f"| kernel TCP | {st.median(k):.1f} | {min(k):.1f} | {max(k):.1f} |",
         f"| preload shm, counters on (default) | {st.median(on):.1f} | {min(on):.1f} | {max(on):.1f} |",
         f"| preload shm, counters off (`RDMAKIT_PRELOAD_STAT=0`) | {st.median(off):.1f} | {min(off):.1f} | {max(off):.1f} |",
         "", f"Counters on / off: median of the per-round ratios **{st.median(pairs):.3f}x** "
         f"(rounds range {min(pairs):.3f}x to {max(pairs):.3f}x); ratio of the medians "
         f"{st.median(on) / st.median(off):.3f}x, of the minima {min(on) / min(off):.3f}x. "
         "A round trip here is two sends and two receives, each counted."]
open(out, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
echo "wrote $out"
