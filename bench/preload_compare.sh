#!/usr/bin/env bash
# Preloaded programs against kernel TCP, in one run, pinned, as ratios
# (docs/preload.md). Both ends on loopback; rounds alternate kernel and
# preload so load changes hit both alike.
#   sockperf TCP ping-pong, 16 B: half round trip p50 / p99 / average
#     kernel | preload (sleeping) | preload (--busy-poll 100)
#   iperf3, one stream: Gbit/s   kernel | preload
# Usage: bench/preload_compare.sh [BUILD_DIR]   (default: build)
#   RDMAKIT_BENCH_CPUS=0,1  RDMAKIT_BENCH_SECONDS=3  RDMAKIT_BENCH_ROUNDS=3
#   RDMAKIT_BENCH_NOTE="loaded machine"
# Writes bench/results/preload-<UTC time>.md (raw outputs in .log).
set -u
cd "$(dirname "$0")/.."
build=${1:-build}
cpus=${RDMAKIT_BENCH_CPUS:-0,1}
secs=${RDMAKIT_BENCH_SECONDS:-3}
rounds=${RDMAKIT_BENCH_ROUNDS:-3}
note=${RDMAKIT_BENCH_NOTE:-}
run=$build/tools/rdmakit-run/rdmakit-run
for p in sockperf iperf3 taskset python3; do
  command -v $p >/dev/null || { echo "missing $p (scripts/deps.sh --bench)"; exit 1; }
done
[ -x "$run" ] || { echo "missing $run (ninja -C $build rdmakit_preload rdmakit-run)"; exit 1; }
c_srv=${cpus#*,} c_cli=${cpus%,*}
stamp=$(date -u +%Y%m%d-%H%M%S)
out=bench/results/preload-$stamp
mkdir -p bench/results
: >"$out.log"
export RDMAKIT_PRELOAD_DIR=$(mktemp -d /tmp/rdmakit-bench.XXXXXX)
trap 'rm -rf "$RDMAKIT_PRELOAD_DIR"' EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_listen() { for _ in $(seq 100); do ss -ltn "sport = :$1" | grep -q LISTEN && return; sleep 0.05; done; }

# sockperf MODE(kernel|preload|spin): prints "p50 p99 avg" (usec)
sockperf_pp() {
  local pre=() port; port=$(free_port)
  case $1 in preload) pre=("$run" --stats) ;; spin) pre=("$run" --stats --busy-poll 100) ;; esac
  taskset -c "$c_srv" "${pre[@]}" sockperf sr --tcp -i 127.0.0.1 -p "$port" >>"$out.log" 2>&1 &
  local spid=$!
  wait_listen "$port"
  local o; o=$(taskset -c "$c_cli" "${pre[@]}" timeout $((secs + 20)) sockperf pp --tcp -i 127.0.0.1 \
    -p "$port" -m 16 -t "$secs" 2>&1)
  kill $spid 2>/dev/null; wait $spid 2>/dev/null
  echo "== sockperf $1" >>"$out.log"; echo "$o" >>"$out.log"
  python3 - "$o" <<'PY'
import re, sys
o = sys.argv[1]
def pct(p):
    m = re.search(r"percentile %s\s*=\s*([\d.]+)" % p, o)
    return m.group(1) if m else "nan"
m = re.search(r"Summary: Latency is ([\d.]+)", o)
print(pct("50.000"), pct("99.000"), m.group(1) if m else "nan")
PY
}

# iperf3 MODE(kernel|preload): prints Gbit/s (receiver)
iperf() {
  local pre=() port; port=$(free_port)
  [ "$1" = preload ] && pre=("$run" --stats)
  taskset -c "$c_srv" "${pre[@]}" iperf3 -s -1 -p "$port" >>"$out.log" 2>&1 &
  local spid=$!
  wait_listen "$port"
  local o; o=$(taskset -c "$c_cli" "${pre[@]}" timeout $((secs + 20)) iperf3 -c 127.0.0.1 -p "$port" \
    -t "$secs" -J 2>>"$out.log")
  wait $spid 2>/dev/null
  echo "== iperf3 $1" >>"$out.log"
  python3 -c 'import json,sys; print("%.3f" % (json.loads(sys.argv[1])["end"]["sum_received"]["bits_per_second"]/1e9))' "$o" 2>/dev/null || echo nan
}

declare -A res
for r in $(seq "$rounds"); do
  for m in kernel preload spin; do res[pp_$m]+="$(sockperf_pp $m);"; done
  for m in kernel preload; do res[bw_$m]+="$(iperf $m) "; done
  echo "round $r done" >&2
done
load=$(cut -d' ' -f1-3 /proc/loadavg)
python3 - "$out.md" "$stamp" "$cpus" "$secs" "$rounds" "$load" "$note" \
  "${res[pp_kernel]}" "${res[pp_preload]}" "${res[pp_spin]}" "${res[bw_kernel]}" "${res[bw_preload]}" <<'PY'
import statistics as st, sys
md, stamp, cpus, secs, rounds, load, note, ppk, ppp, pps, bwk, bwp = sys.argv[1:]
def lat(s):
    rows = [r.split() for r in s.split(";") if r.strip()]
    return [st.median(float(r[i]) for r in rows) for i in range(3)]
def bw(s):
    return st.median(float(x) for x in s.split())
k, p, sp = lat(ppk), lat(ppp), lat(pps)
bk, bp = bw(bwk), bw(bwp)
lines = [f"# Preload vs kernel TCP on loopback, {stamp} UTC", "",
         f"Pinned to CPUs {cpus} (server, client), {secs} s per run, median of {rounds} alternating rounds.",
         f"Load average at the end: {load}. " + (note or ""),
         "**Taken on a machine shared with other builds: absolute numbers are noisy; compare the ratios.**", "",
         "| sockperf TCP ping-pong 16 B (half RTT, usec) | p50 | p99 | avg | avg / kernel |", "|---|---|---|---|---|"]
for name, v in (("kernel TCP", k), ("preload (sleeping)", p), ("preload (--busy-poll 100)", sp)):
    lines.append(f"| {name} | {v[0]:.2f} | {v[1]:.2f} | {v[2]:.2f} | {v[2] / k[2]:.2f}x |")
lines += ["", "| iperf3, 1 stream | Gbit/s | / kernel |", "|---|---|---|",
          f"| kernel TCP | {bk:.2f} | 1.00x |", f"| preload (shm) | {bp:.2f} | {bp / bk:.2f}x |", "",
          "Goals (issue 14): ping-pong at most 0.1x kernel, iperf3 at least 2x."]
open(md, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
echo "wrote $out.md"
