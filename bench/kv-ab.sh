#!/usr/bin/env bash
# Two rdmakit-kv binaries (e.g. before and after a change) in alternating
# rounds (A B A B ...), pinned as `rdmakit-kv bench` pins (server cpu 0,
# clients cpu 1), beside rdmakit-perf read_lat of 512 B (what a READ-GET
# copies of a bucket it has not read yet; on shm read_lat is the same at
# 128-512 B) in each round: shm with one client thread (the latency goal), tcp
# with two client threads and a CPU hog on the server's core, the server
# sleeping and busy-polling (the ops/s goal).
#   bench/kv-ab.sh BINARY_A BINARY_B [LABEL_A LABEL_B]
# KV_AB_ROUNDS (default 3), KV_AB_SHM_OPS (200000), KV_AB_TCP_OPS (20000),
# PERF (default build/tools/rdmakit-perf/rdmakit-perf).
# Results: bench/results/kv-ab-<UTC time>/ (JSON per run, summary.md).
set -euo pipefail
cd "$(dirname "$0")/.."
bin_a=$(realpath "${1:?binary A}"); bin_b=$(realpath "${2:?binary B}")
label_a=${3:-A}; label_b=${4:-B}
rounds=${KV_AB_ROUNDS:-3}
shm_ops=${KV_AB_SHM_OPS:-200000}
tcp_ops=${KV_AB_TCP_OPS:-20000}
perf=${PERF:-build/tools/rdmakit-perf/rdmakit-perf}
out=bench/results/kv-ab-$(date -u +%Y%m%d-%H%M%S)
mkdir -p "$out"
export RDMAKIT_LOG=warn
echo "start: $(uptime)" >"$out/machine.txt"
echo "A = $label_a ($bin_a), B = $label_b ($bin_b)" >>"$out/machine.txt"
configs="shm-lat tcp-busy tcp-busy-bp"
for r in $(seq 1 "$rounds"); do
  if [ -x "$perf" ]; then
    timeout 120 "$perf" read_lat --loopback --provider shm -s 512 -n 200000 \
      --json >"$out/read_lat_shm_512_r$r.json" 2>/dev/null || echo "read_lat round $r failed" >&2
  fi
  for cfg in $configs; do
    case $cfg in
      shm-lat) flags="--provider shm -t 1 -n $shm_ops" ;;
      tcp-busy) flags="--provider tcp -t 2 --server-busy -n $tcp_ops" ;;
      tcp-busy-bp) flags="--provider tcp -t 2 --server-busy --server-busy-poll -n $tcp_ops" ;;
    esac
    for side in A B; do
      bin=$bin_a; [ $side = B ] && bin=$bin_b
      # shellcheck disable=SC2086
      timeout 300 "$bin" bench $flags -k 1000 --json "$out/${cfg}_${side}_r$r.json" \
        >"$out/${cfg}_${side}_r$r.txt" || echo "$cfg $side round $r failed" >&2
    done
  done
done
echo "end: $(uptime)" >>"$out/machine.txt"
python3 - "$out" "$rounds" "$label_a" "$label_b" "$configs" <<'PY'
import json, os, statistics, sys
out, rounds, la, lb, configs = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5].split()

def load(name):
    try:
        with open(os.path.join(out, name)) as f:
            body = f.read()
        return json.loads([l for l in body.splitlines() if l.startswith("{")][-1]
                          if name.startswith("read_lat") else body)
    except (OSError, ValueError, IndexError):
        return None

def phase(j, name, key):
    for p in (j or {}).get("phases", []):
        if p["phase"] == name:
            return p.get(key)
    return None

def fmt(vals, digits=3):
    vals = [v for v in vals if v is not None]
    if not vals:
        return "-"
    return f"{statistics.median(vals):.{digits}f} ({', '.join(f'{v:.{digits}f}' for v in vals)})"

rl = [load(f"read_lat_shm_512_r{r}.json") for r in range(1, rounds + 1)]
rows = ["# rdmakit-kv A/B", "", open(os.path.join(out, "machine.txt")).read().strip(), "",
        f"Alternating rounds ({rounds}): per round read_lat, then each configuration A then B. "
        "Figures: median over rounds (each round's value in brackets). p50s in us; "
        "srv us/op = the server process's CPU time per operation.", "",
        f"read_lat shm 512 B p50 (rdtsc): {fmt([r and r.get('t_typical_us') for r in rl])} us", ""]
metrics = [("get_read p50", lambda j: phase(j, "get_read", "p50_us"), 3),
           ("read_raw p50", lambda j: phase(j, "read_raw", "p50_us"), 3),
           ("get_read_tsc p50", lambda j: phase(j, "get_read_tsc", "p50_us"), 3),
           ("read_raw_tsc p50", lambda j: phase(j, "read_raw_tsc", "p50_us"), 3),
           ("get_read ops/s", lambda j: phase(j, "get_read", "ops_per_s"), 0),
           ("get_rpc ops/s", lambda j: phase(j, "get_rpc", "ops_per_s"), 0),
           ("READ/RPC ops/s", lambda j: j and j.get("read_over_rpc"), 2),
           ("srv us/op get_read", lambda j: phase(j, "get_read", "server_cpu_us_per_op"), 2),
           ("srv us/op get_rpc", lambda j: phase(j, "get_rpc", "server_cpu_us_per_op"), 2)]
for cfg in configs:
    rows += [f"## {cfg}", "", f"| metric | A: {la} | B: {lb} |", "|---|---|---|"]
    runs = {s: [load(f"{cfg}_{s}_r{r}.json") for r in range(1, rounds + 1)] for s in "AB"}
    for name, get, digits in metrics:
        a, b = fmt([get(j) for j in runs["A"]], digits), fmt([get(j) for j in runs["B"]], digits)
        if a != "-" or b != "-":
            rows.append(f"| {name} | {a} | {b} |")
    rows.append("")
summary = "\n".join(rows) + "\n"
with open(os.path.join(out, "summary.md"), "w") as f:
    f.write(summary)
print(summary)
PY
