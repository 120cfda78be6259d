#!/usr/bin/env bash
# Streams next to the core and the floors, in one run, pinned, as ratios:
#   shm 16 B ping-pong half round trip   vs  rdmakit-perf send_lat (shm, 16 B)
#   shm 64 KiB streaming                 vs  single-core memcpy of 64 KiB
#                                        and a bare two-thread SPSC ring (the floor)
#                                        and the two-core handoff floor (rdmakit-floors
#                                        --handoff: 32 x 64 KiB slots, the stream's 2 MiB)
#   tcp 1 MiB streaming                  vs  rdmakit-perf write_bw (tcp, 1 MiB)
#   memory and fds per idle stream (1,000 streams, shm and tcp)
# Usage: bench/stream_compare.sh [BUILD_DIR]   (default: build)
#   RDMAKIT_BENCH_CPUS=0,1  RDMAKIT_BENCH_SECONDS=2  RDMAKIT_BENCH_NOTE="loaded machine"
# Writes bench/results/streams-<UTC time>/{raw.jsonl,summary.md,stderr.log}.
set -u
cd "$(dirname "$0")/.."
build=${1:-build}
cpus=${RDMAKIT_BENCH_CPUS:-0,1}
secs=${RDMAKIT_BENCH_SECONDS:-2}
note=${RDMAKIT_BENCH_NOTE:-}
perf=$build/tools/rdmakit-perf/rdmakit-perf
sbench=$build/bench/rdmakit-stream-bench
floors=$build/bench/rdmakit-floors
for b in "$perf" "$sbench" "$floors"; do
  [ -x "$b" ] || { echo "missing $b (ninja -C $build rdmakit-perf rdmakit-stream-bench rdmakit-floors)"; exit 1; }
done
stamp=$(date -u +%Y%m%d-%H%M%S)
dir=bench/results/streams-$stamp
mkdir -p "$dir"
out=$dir/run
: >"$out.jsonl"
export RDMAKIT_LOG=${RDMAKIT_LOG:-warn}
run() {  # run LABEL CMD... : one JSON line (the last the command printed) tagged with LABEL
  local label=$1; shift
  local line
  line=$("$@" 2>>"$out.log" | grep '^{' | tail -1)
  if [ -z "$line" ]; then echo "{\"label\":\"$label\",\"error\":\"no result\"}" >>"$out.jsonl"; return; fi
  echo "{\"label\":\"$label\",\"result\":$line}" >>"$out.jsonl"
  echo "$label: $line"
}
c0=${cpus%,*}
run core_shm_send_lat_16 "$perf" send_lat --loopback --provider shm -s 16 -D "$secs" --cpu "$c0" --json
run stream_shm_lat_16 "$sbench" lat --provider shm -s 16 -D "$secs" --cpus "$cpus"
run floor_memcpy_64k "$floors" --json --cpus "$cpus" --sizes 65536
run stream_shm_bw_64k "$sbench" bw --provider shm -s 65536 -D "$secs" --cpus "$cpus"
run floor_spsc_64k "$sbench" floor -s 65536 -D "$secs" --cpus "$cpus"
handoff() { "$floors" --json --cpus "$cpus" --sizes 8 --rounds 1 --handoff 65536 --handoff-slots 32 |
  grep '"floor":"handoff"'; }  # its memcpy line comes last
run floor_handoff_64k handoff
# The same with blocking waits (busy_poll 0): on a loaded machine spinning
# ends stall each other, sleeping ones are woken by the scheduler.
run stream_shm_bw_64k_sleep "$sbench" bw --provider shm -s 65536 -D "$secs" --cpus "$cpus" --busy-poll-us 0
run core_tcp_write_bw_1m "$perf" write_bw --loopback --provider tcp -s 1048576 -D "$secs" --cpu "$c0" --json
run stream_tcp_bw_1m "$sbench" bw --provider tcp -s 1048576 -D "$secs" --cpus "$cpus"
run core_shm_write_bw_64k "$perf" write_bw --loopback --provider shm -s 65536 -D "$secs" --cpu "$c0" --json
run stream_shm_idle "$sbench" idle --provider shm --streams 1000 --cpus "$cpus"
run stream_tcp_idle "$sbench" idle --provider tcp --streams 1000 --cpus "$cpus"

python3 - "$out" "$note" "$(nproc) cpus, $(uptime | sed 's/.*load/load/')" <<'PY'
import json, sys
out, note, machine = sys.argv[1], sys.argv[2], sys.argv[3]
r = {}
for line in open(out + ".jsonl"):
    j = json.loads(line)
    if "result" in j: r[j["label"]] = j["result"]
def g(label, key):
    v = r.get(label, {}).get(key)
    return float(v) if v is not None else None
rows = []
def ratio(name, a, b, goal, better):
    if a is None or b is None or b == 0:
        rows.append((name, a, b, None, goal, "missing")); return
    q = a / b
    ok = (q <= goal) if better == "lower" else (q >= goal)
    verdict = "info" if not goal else ("meets goal" if ok else "misses goal")
    rows.append((name, a, b, q, goal, verdict))
ratio("shm 16 B half RTT (us): stream / core send_lat", g("stream_shm_lat_16", "t_typical_us"),
      g("core_shm_send_lat_16", "t_typical_us"), 1.5, "lower")
ratio("shm 16 B half RTT (us), stream's median of 100-exchange batch means / core send_lat",
      g("stream_shm_lat_16", "half_rtt_us"), g("core_shm_send_lat_16", "t_typical_us"), 0.0, "lower")
ratio("shm 64 KiB streaming (MB/s): stream / memcpy", g("stream_shm_bw_64k", "bw_MBps"),
      g("floor_memcpy_64k", "bw_MBps"), 0.45, "higher")
ratio("shm 64 KiB streaming (MB/s): stream / bare SPSC ring floor", g("stream_shm_bw_64k", "bw_MBps"),
      g("floor_spsc_64k", "bw_MBps"), 0.0, "higher")
ratio("shm 64 KiB streaming (MB/s): stream / two-core handoff floor", g("stream_shm_bw_64k", "bw_MBps"),
      g("floor_handoff_64k", "bw_MBps"), 0.0, "higher")
ratio("shm 64 KiB streaming, busy_poll 0 (MB/s): stream / memcpy", g("stream_shm_bw_64k_sleep", "bw_MBps"),
      g("floor_memcpy_64k", "bw_MBps"), 0.45, "higher")
ratio("tcp 1 MiB streaming (MB/s): stream / core write_bw", g("stream_tcp_bw_1m", "bw_MBps"),
      g("core_tcp_write_bw_1m", "bw_avg_MBps"), 0.9, "higher")
ratio("shm 64 KiB streaming (MB/s): stream / core write_bw", g("stream_shm_bw_64k", "bw_MBps"),
      g("core_shm_write_bw_64k", "bw_avg_MBps"), 0.0, "higher")
with open(out + ".md", "w") as f:
    f.write("# Streams vs core and floors (%s)\n\n" % out.split("/")[-2])
    if note: f.write("**Note:** %s\n\n" % note)
    f.write("Machine: %s (at the end of the run)\n\n" % machine)
    f.write("| comparison | stream | baseline | ratio | goal | |\n|---|---|---|---|---|---|\n")
    for name, a, b, q, goal, verdict in rows:
        fmt = lambda v: "-" if v is None else ("%.3f" % v if v < 100 else "%.0f" % v)
        f.write("| %s | %s | %s | %s | %s | %s |\n" % (name, fmt(a), fmt(b), fmt(q),
                ("<= %.2f" % goal) if "RTT" in name else (">= %.2f" % goal if goal else "info"), verdict))
    f.write("\n| idle streams | configured KiB/stream | resident KiB/stream | fds/stream |\n|---|---|---|---|\n")
    for p in ("shm", "tcp"):
        j = r.get("stream_%s_idle" % p, {})
        f.write("| %s x%s | %s | %s | %s |\n" % (p, j.get("streams", "-"), j.get("configured_KiB_per_stream", "-"),
                j.get("resident_KiB_per_stream", "-"), j.get("fds_per_stream", "-")))
print(open(out + ".md").read())
PY
mv "$out.jsonl" "$dir/raw.jsonl"
mv "$out.md" "$dir/summary.md"
if [ -s "$out.log" ]; then mv "$out.log" "$dir/stderr.log"; else rm -f "$out.log"; fi
echo "written: $dir"
