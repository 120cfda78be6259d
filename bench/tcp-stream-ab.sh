#!/usr/bin/env bash
# Two builds (before and after a tcp provider change) side by side on the
# tcp 1 MiB rows of bench/stream_compare.sh, in alternating rounds
# (A core, A stream, B core, B stream, then again), so that a change of load
# during the run hits both alike: the core's write_bw (the goal's
# denominator), the stream's bw, and their ratio per round. The client is
# pinned to CPU 0 and the server to CPU 1 (as in stream_compare.sh).
#   bench/tcp-stream-ab.sh BUILD_A BUILD_B [LABEL_A LABEL_B]
# TCP_AB_ROUNDS (default 8), TCP_AB_SECONDS (default 1.5 per run).
# Results: bench/results/tcp-stream-ab-<date>.md (medians) and .csv (rounds).
set -euo pipefail
cd "$(dirname "$0")/.."
build_a=${1:?build dir A}; build_b=${2:?build dir B}
label_a=${3:-A}; label_b=${4:-B}
rounds=${TCP_AB_ROUNDS:-8}
secs=${TCP_AB_SECONDS:-1.5}
for b in "$build_a" "$build_b"; do
  for t in tools/rdmakit-perf/rdmakit-perf bench/rdmakit-stream-bench; do
    [ -x "$b/$t" ] || { echo "missing $b/$t (ninja -C $b rdmakit-perf rdmakit-stream-bench)"; exit 1; }
  done
done
stamp=$(date -u +%Y%m%d-%H%M%S)
csv=bench/results/tcp-stream-ab-$stamp.csv
md=bench/results/tcp-stream-ab-$stamp.md
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
export RDMAKIT_LOG=${RDMAKIT_LOG:-warn}
echo "round,build,core_write_bw_MBps,stream_bw_MBps,ratio" >"$csv"
for r in $(seq "$rounds"); do
  for side in a b; do
    if [ $side = a ]; then b=$build_a; l=$label_a; else b=$build_b; l=$label_b; fi
    core=$("$b/tools/rdmakit-perf/rdmakit-perf" write_bw --loopback --provider tcp -s 1048576 \
      -D "$secs" --cpu 0 --json 2>/dev/null | grep -o '"bw_avg_MBps":[0-9.]*' | cut -d: -f2)
    stream=$("$b/bench/rdmakit-stream-bench" bw --provider tcp -s 1048576 -D "$secs" \
      --cpus 0,1 2>/dev/null | grep -o '"bw_MBps":[0-9.]*' | cut -d: -f2)
    ratio=$(awk -v s="${stream:-0}" -v c="${core:-0}" 'BEGIN{printf "%.3f", (c > 0) ? s / c : 0}')
    echo "$r,$l,${core:-},${stream:-},$ratio" | tee -a "$csv"
  done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
python3 - "$csv" "$md" "$label_a" "$label_b" "$load_before" "$load_after" "$(nproc)" <<'PY'
import csv, statistics as st, sys
path, md, la, lb, l0, l1, ncpu = sys.argv[1:]
rows = list(csv.DictReader(open(path)))
def med(label, key):
    v = [float(r[key]) for r in rows if r["build"] == label and r[key]]
    return st.median(v) if v else float("nan"), len(v)
loaded = max(float(l0.split()[0]), float(l1.split()[0])) > int(ncpu)
with open(md, "w") as f:
    f.write(f"# tcp 1 MiB: stream vs core write_bw, {la} vs {lb}\n\n")
    f.write(f"{ncpu} CPUs, load average {l0} before, {l1} after.")
    if loaded:
        f.write(" **Taken on a loaded machine**: figures are noisy; rounds alternate the builds.")
    f.write(f"\n\n{len(rows) // 2} alternating rounds; medians; every round: {path.split('/')[-1]}.\n\n")
    f.write("| build | core write_bw MB/s | stream bw MB/s | stream / core (median of rounds) |\n|---|---|---|---|\n")
    for l in (la, lb):
        c, _ = med(l, "core_write_bw_MBps"); s, _ = med(l, "stream_bw_MBps"); q, _ = med(l, "ratio")
        f.write(f"| {l} | {c:.0f} | {s:.0f} | {q:.2f}x |\n")
print(open(md).read())
PY
