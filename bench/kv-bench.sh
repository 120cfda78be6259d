#!/usr/bin/env bash
# rdmakit-kv bench next to the core's read_lat, in one run, pinned (server
# cpu 0, clients cpu 1), on shm and tcp: two client threads with the server's
# core idle and busy (a CPU hog on it), and one client thread for the latency
# comparison; each with the server sleeping when idle and busy-polling. Writes bench/results/kv-<UTC time>/ (JSON and text per run,
# summary.md with the ratios the kv's goals are stated in).
#   bench/kv-bench.sh [BUILD_DIR] [OPS]        defaults: build-rel, 100000
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-rel}
ops=${2:-100000}
kv=$build/apps/kv/rdmakit-kv
perf=$build/tools/rdmakit-perf/rdmakit-perf
[ -x "$kv" ] && [ -x "$perf" ] || {
  echo "build first: ninja -C $build rdmakit-kv rdmakit-perf" >&2; exit 1; }
out=bench/results/kv-$(date -u +%Y%m%d-%H%M%S)
mkdir -p "$out"
export RDMAKIT_LOG=warn
{
  echo "host: $(uname -n) $(uname -r)"; echo "cpus: $(nproc)"; uptime
  grep -m1 'model name' /proc/cpuinfo || true
} >"$out/machine.txt"
# What a READ-GET copies in one READ: the first 4 slots of the key's
# neighborhood (512 B); 2048 B (the whole neighborhood, what it copied before)
# for comparison with older results.
read_size=512
# Runs: idle / busy (a CPU hog on the server's core) with 2 client threads,
# lat with 1; each with the server sleeping between completions (default) and
# busy-polling (-bp, as read_lat's target does).
runs="idle busy lat idle-bp busy-bp lat-bp"
for p in shm tcp; do
  n=$ops; [ $p = tcp ] && n=$((ops / 4))   # tcp READs cost a loopback round trip each
  for size in $read_size 2048; do
    timeout 300 "$perf" read_lat --loopback --provider $p -s "$size" -n "$n" --json \
      >"$out/read_lat_${p}_$size.json" 2>"$out/read_lat_${p}_$size.log" ||
      echo "read_lat $p $size failed" >&2
  done
  for run in $runs; do
    case $run in
      idle*) flags="-t 2" ;;
      busy*) flags="-t 2 --server-busy" ;;
      lat*) flags="-t 1" ;;
    esac
    case $run in *-bp) flags="$flags --server-busy-poll" ;; esac
    # shellcheck disable=SC2086
    timeout 600 "$kv" bench --provider $p -n "$n" -k 1000 $flags \
      --json "$out/kv_${p}_$run.json" | tee "$out/kv_${p}_$run.txt" ||
      echo "kv bench $p $run failed" >&2
  done
done
echo "end: $(uptime)" >>"$out/machine.txt"
python3 - "$out" "$read_size" "$runs" <<'PY'
import json, os, sys
out, read_size, runs = sys.argv[1], sys.argv[2], sys.argv[3].split()

def load(name):
    path = os.path.join(out, name)
    try:
        with open(path) as f:
            body = f.read()
        if name.startswith("read_lat"):  # one JSON object per line
            return json.loads([l for l in body.splitlines() if l.startswith("{")][-1])
        return json.loads(body)
    except (OSError, ValueError, IndexError):
        return None

rows = ["# rdmakit-kv bench", "",
        "Taken on a loaded machine (2 cores shared with other builds and tests): compare ratios "
        "within this run, not absolute figures across runs.", "",
        "Load (uptime at start and end): " + "; ".join(
            l.strip() for l in open(os.path.join(out, "machine.txt"))
            if "load average" in l), "",
        "Runs: idle = 2 client threads, server core idle; busy = the same with a CPU hog on the "
        "server's core (--server-busy); lat = 1 client thread. `-bp`: the server busy-polls its "
        "completion queue (--server-busy-poll, as rdmakit-perf read_lat's target does); "
        "otherwise it sleeps when idle and, on tcp, the provider's progress thread serves READs. "
        "read_raw = the first READ of each READ-GET alone (same bytes, QP, wait and clock): "
        f"the in-run baseline. read_lat = rdmakit-perf read_lat of {read_size} B (what a READ-GET "
        "copies) and of 2048 B (the whole neighborhood, what it copied before).", "",
        "*_tsc: the same READ-GET / bare READ timed with rdtsc, as read_lat times (the lab's "
        "figures are the CLOCK_MONOTONIC ones; the TSC ones are the like-for-like comparison "
        "with read_lat). server us/op: the server process's CPU time (all threads, spinning "
        "included) per operation of the phase.", "",
        "| provider | run | phase | ops/s | p50 us | p99 us | p99.9 us | server CPU share "
        "| server us/op |",
        "|---|---|---|---|---|---|---|---|---|"]
goals = []
for p in ("shm", "tcp"):
    rl = {s: load(f"read_lat_{p}_{s}.json") for s in (read_size, "2048")}
    ratio = {}
    for run in runs:
        j = load(f"kv_{p}_{run}.json")
        if not j:
            rows.append(f"| {p} | {run} | (failed) | | | | | | |")
            continue
        ph = {x["phase"]: x for x in j["phases"]}
        for name in ("put", "get_rpc", "get_read", "read_raw", "get_read_tsc", "read_raw_tsc"):
            x = ph.get(name)
            if not x:
                continue
            rows.append(f"| {p} | {run} | {name} | {x['ops_per_s']:.0f} | {x['p50_us']:.3f} | "
                        f"{x['p99_us']:.3f} | {x['p999_us']:.3f} | {x['server_cpu_share']:.2f} "
                        f"| {x.get('server_cpu_us_per_op', 0):.2f} |")
        rd, raw = ph["get_read"], ph["read_raw"]
        ratio[run] = rd["ops_per_s"] / max(ph["get_rpc"]["ops_per_s"], 1e-9)
        if not run.startswith("lat"):
            goals.append(f"- {p} {run}: READ GET / RPC GET ops/s = **{ratio[run]:.2f}x** "
                         f"(goal with the core busy: >= 2x); server CPU share during the READ "
                         f"GETs {rd['server_cpu_share']:.2f}; server CPU per op: READ GET "
                         f"{rd.get('server_cpu_us_per_op', 0):.2f} us, RPC GET "
                         f"{ph['get_rpc'].get('server_cpu_us_per_op', 0):.2f} us")
            continue
        line = (f"- {p} {run}, 1 client thread: READ GET p50 {rd['p50_us']:.3f} us; "
                f"its bare READ (read_raw) {raw['p50_us']:.3f} us = **"
                f"{rd['p50_us'] / max(raw['p50_us'], 1e-9):.2f}x** (goal <= 1.3x)")
        for size, r in rl.items():
            if r:
                base = r.get("t_typical_us") or r.get("t_avg_us")
                line += f"; read_lat {size} B {base:.3f} us = **{rd['p50_us'] / base:.2f}x**"
        line += (f". {j.get('get_read_reads_per_get', 0):.3f} READs and "
                 f"{j.get('get_read_bytes_per_get', 0):.0f} B per GET; floors in this run: "
                 f"one clock read {j.get('floor_timer_ns', 0):.0f} ns (in every kv figure, "
                 f"not in read_lat's TSC timing), the checks of a {read_size} B copy "
                 f"{j.get('floor_check_ns', 0):.0f} ns")
        if "get_read_tsc" in ph:
            gt, rt = ph["get_read_tsc"]["p50_us"], ph["read_raw_tsc"]["p50_us"]
            line += (f". Timed with rdtsc as read_lat is: READ GET p50 {gt:.3f} us, bare READ "
                     f"{rt:.3f} us")
            r = rl.get(read_size)
            if r:
                base = r.get("t_typical_us") or r.get("t_avg_us")
                line += f"; READ GET / read_lat {read_size} B = **{gt / base:.2f}x**"
        goals.append(line)
    for mode in ("", "-bp"):
        if f"idle{mode}" in ratio and f"busy{mode}" in ratio:
            goals.append(f"- {p}{mode or ' (server sleeps)'}: READ/RPC ops/s idle "
                         f"{ratio['idle' + mode]:.2f}x -> core busy "
                         f"{ratio['busy' + mode]:.2f}x")
summary = "\n".join(rows + ["", "## Against the goals", ""] + goals) + "\n"
with open(os.path.join(out, "summary.md"), "w") as f:
    f.write(summary)
print(summary)
PY
