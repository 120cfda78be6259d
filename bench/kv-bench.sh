#!/usr/bin/env bash
# rdmakit-kv bench next to the core's read_lat, in one run, pinned (server
# cpu 0, clients cpu 1), on shm and tcp: two client threads with the server's
# core idle and busy (a CPU hog on it), and one client thread for the latency
# comparison. Writes bench/results/kv-<UTC time>/ (JSON and text per run,
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
# The neighborhood a READ-GET copies: 16 slots of 128 B.
read_size=2048
for p in shm tcp; do
  n=$ops; [ $p = tcp ] && n=$((ops / 4))   # tcp READs cost a loopback round trip each
  timeout 300 "$perf" read_lat --loopback --provider $p -s $read_size -n $n --json \
    >"$out/read_lat_$p.json" 2>"$out/read_lat_$p.log" || echo "read_lat $p failed" >&2
  for run in idle busy lat; do
    flags="-t 2"; [ $run = busy ] && flags="-t 2 --server-busy"; [ $run = lat ] && flags="-t 1"
    # shellcheck disable=SC2086
    timeout 600 "$kv" bench --provider $p -n "$n" -k 1000 $flags \
      --json "$out/kv_${p}_$run.json" | tee "$out/kv_${p}_$run.txt" ||
      echo "kv bench $p $run failed" >&2
  done
done
python3 - "$out" "$read_size" <<'PY'
import json, os, sys
out, read_size = sys.argv[1], sys.argv[2]

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
        "Runs: idle = 2 client threads, server core idle; busy = the same with a CPU hog on the "
        "server's core (--server-busy); lat = 1 client thread, for the latency comparison with "
        f"rdmakit-perf read_lat of {read_size} B (what a READ-GET copies).", "",
        "| provider | run | phase | ops/s | p50 us | p99 us | p99.9 us | server CPU share |",
        "|---|---|---|---|---|---|---|---|"]
goals = []
for p in ("shm", "tcp"):
    rl = load(f"read_lat_{p}.json")
    for run in ("idle", "busy", "lat"):
        j = load(f"kv_{p}_{run}.json")
        if not j:
            rows.append(f"| {p} | {run} | (failed) | | | | | |")
            continue
        ph = {x["phase"]: x for x in j["phases"]}
        for name in ("put", "get_rpc", "get_read"):
            x = ph[name]
            rows.append(f"| {p} | {run} | {name} | {x['ops_per_s']:.0f} | {x['p50_us']:.2f} | "
                        f"{x['p99_us']:.2f} | {x['p999_us']:.2f} | {x['server_cpu_share']:.2f} |")
        rd = ph["get_read"]
        if run != "lat":
            ratio = rd["ops_per_s"] / max(ph["get_rpc"]["ops_per_s"], 1e-9)
            goals.append(f"- {p}, 2 client threads, server core {run}: READ GET / RPC GET ops/s "
                         f"= **{ratio:.2f}x** (goal with the core busy: >= 2x); server CPU share "
                         f"during the READ GETs {rd['server_cpu_share']:.2f}")
        elif rl:
            base = rl.get("t_typical_us") or rl.get("t_avg_us")
            goals.append(f"- {p}, 1 client thread: READ GET p50 {rd['p50_us']:.2f} us vs "
                         f"read_lat typical {base:.2f} us = **{rd['p50_us'] / base:.2f}x** "
                         f"(goal <= 1.3x)")
summary = "\n".join(rows + ["", "## Against the goals", ""] + goals) + "\n"
with open(os.path.join(out, "summary.md"), "w") as f:
    f.write(summary)
print(summary)
PY
