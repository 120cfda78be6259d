#!/usr/bin/env bash
# Two builds side by side on the shm rows of bench/compare, in alternating
# rounds (A then B, again), so that a change of load during the run hits both
# alike: the core's send_lat (8 B: the small-SEND path; 4 KiB: the payload
# path), write_bw and read_bw (64 KiB), and the stream's 16 B ping-pong and
# 64 KiB streaming. Both ends pinned to different cores.
#   bench/shm-ab.sh BUILD_A BUILD_B [LABEL_A LABEL_B]
# SHM_AB_ROUNDS (default 5), SHM_AB_SECONDS (default 1 per run).
# Results: bench/results/shm-ab-<date>.md (medians, B/A) and .csv (rounds).
set -euo pipefail
cd "$(dirname "$0")/.."
build_a=${1:?build dir A}; build_b=${2:?build dir B}
label_a=${3:-A}; label_b=${4:-B}
rounds=${SHM_AB_ROUNDS:-5}
secs=${SHM_AB_SECONDS:-1}
for b in "$build_a" "$build_b"; do
  for t in tools/rdmakit-perf/rdmakit-perf bench/rdmakit-stream-bench; do
    [ -x "$b/$t" ] || { echo "missing $b/$t (ninja -C $b rdmakit-perf rdmakit-stream-bench)"; exit 1; }
  done
done
stamp=$(date -u +%Y%m%d-%H%M%S)
csv=bench/results/shm-ab-$stamp.csv
md=bench/results/shm-ab-$stamp.md
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
export RDMAKIT_LOG=warn RDMAKIT_PROVIDER=shm
perf() {  # perf BUILD TEST SIZE FIELD
  "$1/tools/rdmakit-perf/rdmakit-perf" "$2" --loopback --provider shm -s "$3" -D "$secs" \
    --cpu 0 --json 2>/dev/null | grep -o "\"$4\":[0-9.]*" | head -1 | cut -d: -f2
}
stream() {  # stream BUILD TEST SIZE FIELD
  "$1/bench/rdmakit-stream-bench" "$2" --provider shm -s "$3" -D "$secs" --cpus 0,1 \
    2>/dev/null | grep -o "\"$4\":[0-9.]*" | head -1 | cut -d: -f2
}
echo "round,build,send_lat_8_us,send_lat_4096_us,write_bw_65536_MBps,read_bw_65536_MBps,stream_lat_16_us,stream_bw_65536_MBps" >"$csv"
for r in $(seq "$rounds"); do
  for side in a b; do
    if [ $side = a ]; then b=$build_a; l=$label_a; else b=$build_b; l=$label_b; fi
    row="$r,$l,$(perf "$b" send_lat 8 t_typical_us),$(perf "$b" send_lat 4096 t_typical_us)"
    row="$row,$(perf "$b" write_bw 65536 bw_avg_MBps),$(perf "$b" read_bw 65536 bw_avg_MBps)"
    row="$row,$(stream "$b" lat 16 half_rtt_us),$(stream "$b" bw 65536 bw_MBps)"
    echo "$row" | tee -a "$csv"
  done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
python3 - "$csv" "$md" "$label_a" "$label_b" "$load_before" "$load_after" "$(nproc)" <<'PY'
import csv, statistics as st, sys
path, md, la, lb, l0, l1, ncpu = sys.argv[1:]
rows = list(csv.DictReader(open(path)))
keys = [k for k in rows[0] if k not in ("round", "build")]
def med(label, key):
    v = [float(r[key]) for r in rows if r["build"] == label and r[key]]
    return st.median(v) if v else float("nan")
with open(md, "w") as f:
    f.write(f"# shm rows: {la} vs {lb}\n\n{ncpu} CPUs, load average {l0} before, {l1} after; ")
    f.write(f"{len(rows) // 2} alternating rounds, medians ({path.split('/')[-1]}).\n")
    f.write("For latencies lower is better, for bandwidths higher; 'B vs A' is B's figure as a\n")
    f.write("fraction of A's, oriented so that above 1.00 means B is better.\n\n")
    f.write(f"| row | {la} | {lb} | B vs A |\n|---|---|---|---|\n")
    for k in keys:
        a, b = med(la, k), med(lb, k)
        better = (a / b) if k.endswith("_us") else (b / a)
        f.write(f"| {k} | {a:.3f} | {b:.3f} | {better:.2f}x |\n")
print(open(md).read())
PY
