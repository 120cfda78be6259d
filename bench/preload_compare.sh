#!/usr/bin/env bash
# Preloaded programs against kernel TCP, in one run, pinned, as ratios
# (docs/preload.md). Both ends on loopback; rounds alternate the modes so
# load changes hit all of them alike; each round starts with the next mode, so
# no mode always runs first. Modes:
#   kernel    plain programs (the baseline)
#   shm       both ends under rdmakit-run at its defaults: connections upgraded
#             to shm streams; blocking calls and poll/epoll_wait/select take
#             readiness from the rings for up to 50 us (the default busy-poll)
#             before they sleep
#   nospin    shm with --busy-poll 0: every wait sleeps in the kernel and is
#             woken by the stream engine's progress thread
#   base      shm with the library RDMAKIT_BENCH_BASE_LIB (a build of an
#             earlier commit) and the options RDMAKIT_BENCH_BASE_ARGS (e.g.
#             "--busy-poll 50"): before/after in the same run
#   fallback  both ends under rdmakit-run with --deny-ports 1-65535: every
#             connection stays on kernel TCP, every call goes through the hooks
#   nostat    shm with RDMAKIT_PRELOAD_STAT=0: no statistics file, no
#             counters (what the counters cost, same build)
# Rows:
#   sockperf TCP ping-pong, 16 B, client --nonblocked (both ends busy-poll:
#     the kernel client by its non-blocking reads, the preloaded ones by the
#     preload's spin as well): half round trip p50 / p99 / average. At most
#     500,000 round trips per second: sockperf sizes its table of send times
#     for fewer than the ~1M/s of a sub-microsecond round trip and stops
#     with "_seqN > m_maxSequenceNo" beyond it
#   iperf3, one stream: Gbit/s
#   redis-benchmark SET and GET, 50 clients, no pipelining: requests/s, p50,
#     p99, CPU (server + client) per request
#   nginx (master + 2 workers) + wrk (2 threads, 50 connections), 600 B file:
#     requests/s, p50, p99, CPU per request
# Usage: bench/preload_compare.sh [BUILD_DIR]   (default: build)
#   RDMAKIT_BENCH_CPUS=0,1  RDMAKIT_BENCH_SECONDS=3  RDMAKIT_BENCH_ROUNDS=3
#   RDMAKIT_BENCH_ROWS="pp iperf redis nginx"  RDMAKIT_BENCH_NOTE="loaded machine"
#   RDMAKIT_BENCH_BASE_LIB=/path/librdmakit-preload.so (adds the base mode)
#   RDMAKIT_BENCH_BASE_ARGS="--busy-poll 50" (rdmakit-run options of the base mode)
#   RDMAKIT_BENCH_MODES="kernel fallback" (a subset of the modes, e.g. for more rounds)
#   RDMAKIT_BENCH_REF=nostat (the mode the ratios are against; default kernel, else base)
# Writes bench/results/preload-<UTC time>.md (raw outputs in .log).
set -u
cd "$(dirname "$0")/.."
build=${1:-build}
cpus=${RDMAKIT_BENCH_CPUS:-0,1}
secs=${RDMAKIT_BENCH_SECONDS:-3}
rounds=${RDMAKIT_BENCH_ROUNDS:-3}
rows=${RDMAKIT_BENCH_ROWS:-pp iperf redis nginx}
note=${RDMAKIT_BENCH_NOTE:-}
base_lib=${RDMAKIT_BENCH_BASE_LIB:-}
read -r -a base_args <<<"${RDMAKIT_BENCH_BASE_ARGS:-}"
base=""
[ -n "$base_lib" ] && base=base
run=$(realpath "$build/tools/rdmakit-run/rdmakit-run")
for p in sockperf iperf3 taskset python3 redis-server redis-benchmark nginx wrk /usr/bin/time; do
  command -v $p >/dev/null || { echo "missing $p (scripts/deps.sh --bench)"; exit 1; }
done
[ -x "$run" ] || { echo "missing $run (ninja -C $build rdmakit_preload rdmakit-run)"; exit 1; }
c_srv=${cpus#*,} c_cli=${cpus%,*}
stamp=$(date -u +%Y%m%d-%H%M%S)
out=$PWD/bench/results/preload-$stamp
mkdir -p bench/results
: >"$out.log"
tmp=$(mktemp -d /tmp/rdmakit-bench.XXXXXX)
export RDMAKIT_PRELOAD_DIR=$tmp/rdv
mkdir -m 700 "$RDMAKIT_PRELOAD_DIR"
trap 'rm -rf "$tmp"' EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_listen() { for _ in $(seq 200); do ss -ltn "sport = :$1" | grep -q LISTEN && return; sleep 0.05; done; }
# pre MODE: the wrapper (and options) for a mode, in the array P
pre() {
  case $1 in
    kernel) P=() ;;
    shm) P=("$run") ;;
    nospin) P=("$run" --busy-poll 0) ;;
    base) P=("$run" --lib "$base_lib" "${base_args[@]}") ;;
    fallback) P=("$run" --deny-ports 1-65535) ;;
    nostat) P=(env RDMAKIT_PRELOAD_STAT=0 "$run") ;;
  esac
}
# cpu_of FILE...: user+sys seconds summed over /usr/bin/time -f "%U %S" files
cpu_of() { cat "$@" | awk '{s += $1 + $2} END {printf "%.3f", s}'; }

# sockperf ping-pong MODE: prints "p50 p99 avg" (usec)
sockperf_pp() {
  local port; port=$(free_port); pre "$1"
  taskset -c "$c_srv" "${P[@]}" timeout $((secs + 30)) sockperf sr --tcp -i 127.0.0.1 -p "$port" \
    >>"$out.log" 2>&1 &
  local spid=$!
  wait_listen "$port"
  local o; o=$(taskset -c "$c_cli" "${P[@]}" timeout $((secs + 20)) sockperf pp --tcp -i 127.0.0.1 \
    -p "$port" -m 16 -t "$secs" --nonblocked --mps 500000 2>&1)
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

# iperf3 MODE: prints Gbit/s (receiver)
iperf() {
  local port; port=$(free_port); pre "$1"
  taskset -c "$c_srv" "${P[@]}" timeout $((secs + 30)) iperf3 -s -1 -p "$port" >>"$out.log" 2>&1 &
  local spid=$!
  wait_listen "$port"
  local o; o=$(taskset -c "$c_cli" "${P[@]}" timeout $((secs + 20)) iperf3 -c 127.0.0.1 -p "$port" \
    -t "$secs" -J 2>>"$out.log")
  wait $spid 2>/dev/null
  echo "== iperf3 $1" >>"$out.log"
  python3 -c 'import json,sys; print("%.3f" % (json.loads(sys.argv[1])["end"]["sum_received"]["bits_per_second"]/1e9))' "$o" 2>/dev/null || echo nan
}

# redis MODE: prints "set_rps set_p50 set_p99 get_rps get_p50 get_p99 cpu_us_per_req"
redis() {
  local port; port=$(free_port); pre "$1"
  local n=$((secs * 20000))
  rm -f "$tmp"/t-*
  taskset -c "$c_srv" /usr/bin/time -f "%U %S" -o "$tmp/t-srv" "${P[@]}" timeout $((secs * 4 + 30)) \
    redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no >>"$out.log" 2>&1 &
  local spid=$!
  wait_listen "$port"
  local o; o=$(taskset -c "$c_cli" /usr/bin/time -f "%U %S" -o "$tmp/t-cli" "${P[@]}" \
    timeout $((secs * 4 + 20)) redis-benchmark -p "$port" -t set,get -n "$n" -c 50 --csv 2>>"$out.log")
  timeout 5 redis-cli -p "$port" shutdown nosave >/dev/null 2>&1; wait $spid 2>/dev/null
  echo "== redis $1" >>"$out.log"; echo "$o" >>"$out.log"
  python3 - "$o" "$n" "$(cpu_of "$tmp/t-srv" "$tmp/t-cli" 2>/dev/null || echo nan)" <<'PY'
import csv, io, sys
rows = {r["test"]: r for r in csv.DictReader(io.StringIO(sys.argv[1]))}
n, cpu = int(sys.argv[2]), float(sys.argv[3])
v = []
for t in ("SET", "GET"):
    r = rows.get(t, {})
    v += [r.get("rps", "nan"), r.get("p50_latency_ms", "nan"), r.get("p99_latency_ms", "nan")]
print(*v, "%.2f" % (cpu / (2 * n) * 1e6))
PY
}

# nginx MODE: prints "rps p50_ms p99_ms cpu_us_per_req"
nginx_wrk() {
  local port; port=$(free_port); pre "$1"
  local d=$tmp/ngx-$1; mkdir -p "$d/www"
  head -c 600 /dev/urandom >"$d/www/small.bin"
  cat >"$d/nginx.conf" <<EOF
daemon off; master_process on; worker_processes 2; user $(id -un) $(id -gn);
pid $d/nginx.pid; error_log $d/error.log warn;
events { use epoll; worker_connections 512; }
http { access_log off; sendfile on; client_body_temp_path $d/b; proxy_temp_path $d/p;
  fastcgi_temp_path $d/f; uwsgi_temp_path $d/u; scgi_temp_path $d/s;
  server { listen 127.0.0.1:$port; root $d/www; } }
EOF
  rm -f "$tmp"/t-*
  taskset -c "$c_srv" /usr/bin/time -f "%U %S" -o "$tmp/t-srv" "${P[@]}" timeout $((secs + 30)) \
    nginx -c "$d/nginx.conf" -p "$d" -e "$d/error.log" >>"$out.log" 2>&1 &
  local spid=$!
  wait_listen "$port"
  local o; o=$(taskset -c "$c_cli" /usr/bin/time -f "%U %S" -o "$tmp/t-cli" "${P[@]}" \
    timeout $((secs + 20)) wrk -t 2 -c 50 -d "$secs" --latency "http://127.0.0.1:$port/small.bin" 2>&1)
  kill -QUIT "$(cat "$d/nginx.pid")" 2>/dev/null; wait $spid 2>/dev/null
  echo "== nginx+wrk $1" >>"$out.log"; echo "$o" >>"$out.log"
  python3 - "$o" "$(cpu_of "$tmp/t-srv" "$tmp/t-cli" 2>/dev/null || echo nan)" <<'PY'
import re, sys
o, cpu = sys.argv[1], float(sys.argv[2])
def ms(p):
    m = re.search(r"^\s*%s%%\s+([\d.]+)(us|ms|s)" % p, o, re.M)
    if not m: return float("nan")
    return float(m.group(1)) * {"us": 1e-3, "ms": 1, "s": 1e3}[m.group(2)]
m = re.search(r"(\d+) requests in", o)
r = re.search(r"Requests/sec:\s*([\d.]+)", o)
n = int(m.group(1)) if m else 0
bad = "Socket errors" in o or "Non-2xx" in o
print(r.group(1) if r and not bad else "nan", "%.3f" % ms(50), "%.3f" % ms(99),
      "%.2f" % (cpu / n * 1e6) if n else "nan")
PY
}

modes=${RDMAKIT_BENCH_MODES:-kernel shm nospin $base fallback}
declare -A res
read -r -a mode_list <<<"$modes"
for r in $(seq "$rounds"); do
  # Each round starts with the next mode, so no mode always runs first.
  k=$(( (r - 1) % ${#mode_list[@]} ))
  order="${mode_list[*]:k} ${mode_list[*]:0:k}"
  for row in $rows; do
    case $row in
      pp) for m in $order; do res[pp_$m]+="$(sockperf_pp $m);"; done ;;
      iperf) for m in $order; do res[bw_$m]+="$(iperf $m);"; done ;;
      redis) for m in $order; do res[rd_$m]+="$(redis $m);"; done ;;
      nginx) for m in $order; do res[ng_$m]+="$(nginx_wrk $m);"; done ;;
    esac
  done
  echo "round $r done" >&2
done
load=$(cut -d' ' -f1-3 /proc/loadavg)
{ for k in "${!res[@]}"; do echo "$k=${res[$k]}"; done; } >"$tmp/res"
{ echo "== per-round values"; cat "$tmp/res"; } >>"$out.log"
python3 - "$out.md" "$stamp" "$cpus" "$secs" "$rounds" "$load" "$note" "$tmp/res" "$base_lib" \
  "${RDMAKIT_BENCH_BASE_ARGS:-}" <<'PY'
import math, os, statistics as st, sys
md, stamp, cpus, secs, rounds, load, note, resf, base_lib, base_args = sys.argv[1:]
res = dict(l.rstrip("\n").split("=", 1) for l in open(resf) if "=" in l)
def med(key):
    rows = [r.split() for r in res.get(key, "").split(";") if r.strip()]
    if not rows: return None
    out = []
    for i in range(len(rows[0])):
        vals = [float(r[i]) for r in rows if i < len(r) and r[i] != "nan"]
        out.append(st.median(vals) if vals else math.nan)
    return out
ref = os.environ.get("RDMAKIT_BENCH_REF") or ("kernel" if any(k.endswith("_kernel") for k in res) else "base")
def ratio(a, b): return f"{a / b:.2f}x" if b and not math.isnan(a) and not math.isnan(b) else "n/a"
def rounds_of(key, i):
    return [float(r.split()[i]) if len(r.split()) > i and r.split()[i] != "nan" else math.nan
            for r in res.get(key, "").split(";") if r.strip()]
# Per-round ratios: the modes of one round ran back to back, so a ratio
# within a round cancels the load drift that moves the medians above.
def paired(key, m, i):
    a, b = rounds_of(key + m, i), rounds_of(key + ref, i)
    q = sorted(x / y for x, y in zip(a, b) if y and not math.isnan(x) and not math.isnan(y))
    if len(q) < 2: return None
    return st.median(q), q[len(q) // 4], q[(3 * len(q)) // 4], len(q)
pairs = []
for key, i, what in (("pp_", 2, "sockperf half RTT avg (lower is better)"), ("bw_", 0, "iperf3 Gbit/s"),
                     ("rd_", 0, "redis SET req/s"), ("rd_", 3, "redis GET req/s"),
                     ("ng_", 0, "nginx+wrk req/s")):
    for m in ("kernel", "shm", "nostat", "nospin", "base", "fallback"):
        if m == ref: continue
        v = paired(key, m, i)
        if v: pairs.append(f"| {what} | {m} / {ref} | {v[0]:.3f}x | {v[1]:.3f}x .. {v[2]:.3f}x | {v[3]} |")
lines = [f"# Preload vs kernel TCP on loopback, {stamp} UTC", "",
         f"Pinned to CPUs {cpus} (server, client), {secs} s per run, median of {rounds} alternating rounds.",
         f"Load average at the end: {load}. " + (note or ""),
         "**Taken on a machine shared with other builds: absolute numbers are noisy; compare the ratios.**", "",
         f"Ratios are against the {ref} mode.", "",
         "Modes: kernel = plain programs; shm = both ends preloaded (upgraded to shm streams, "
         "default options: 50 us busy-poll); nospin = shm with --busy-poll 0; "
         + (f"base = shm with {base_lib} {base_args or 'at its defaults'} (before); " if base_lib else "")
         + "fallback = both ends preloaded with --deny-ports 1-65535 (kernel TCP through the hooks); "
         + "nostat = shm with RDMAKIT_PRELOAD_STAT=0 (no counters).", ""]
names = {"kernel": "kernel TCP", "shm": "preload shm (default busy-poll 50 us)",
         "nospin": "preload shm, --busy-poll 0", "base": "preload shm, base library",
         "fallback": "preload fallback (kernel TCP)", "nostat": "preload shm, no counters"}
modes = ("kernel", "shm", "nostat", "nospin", "base", "fallback")
k = med("pp_" + ref)
if k:
    lines += ["| sockperf TCP ping-pong 16 B, --nonblocked (half RTT, usec) | p50 | p99 | avg | p50 / ref | avg / ref |", "|---|---|---|---|---|---|"]
    for m in modes:
        v = med("pp_" + m)
        if v: lines.append(f"| {names[m]} | {v[0]:.2f} | {v[1]:.2f} | {v[2]:.2f} | {ratio(v[0], k[0])} | {ratio(v[2], k[2])} |")
    lines.append("")
k = med("bw_" + ref)
if k:
    lines += ["| iperf3, 1 stream | Gbit/s | / ref |", "|---|---|---|"]
    for m in modes:
        v = med("bw_" + m)
        if v: lines.append(f"| {names[m]} | {v[0]:.2f} | {ratio(v[0], k[0])} |")
    lines.append("")
k = med("rd_" + ref)
if k:
    lines += ["| redis-benchmark, 50 clients | SET req/s | p50 ms | p99 ms | GET req/s | p50 ms | p99 ms | CPU us/req | SET / ref | GET / ref |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for m in modes:
        v = med("rd_" + m)
        if v: lines.append(f"| {names[m]} | {v[0]:.0f} | {v[1]:.3f} | {v[2]:.3f} | {v[3]:.0f} | {v[4]:.3f} | {v[5]:.3f} | {v[6]:.1f} | {ratio(v[0], k[0])} | {ratio(v[3], k[3])} |")
    lines.append("")
k = med("ng_" + ref)
if k:
    lines += ["| nginx (2 workers) + wrk, 600 B file, 50 connections | req/s | p50 ms | p99 ms | CPU us/req | / ref |", "|---|---|---|---|---|---|"]
    for m in modes:
        v = med("ng_" + m)
        if v: lines.append(f"| {names[m]} | {v[0]:.0f} | {v[1]:.3f} | {v[2]:.3f} | {v[3]:.1f} | {ratio(v[0], k[0])} |")
    lines.append("")
if pairs:
    lines += ["Per-round ratios (each round's modes ran back to back): median and quartiles.", "",
              "| row | ratio | median | quartiles | rounds |", "|---|---|---|---|---|"] + pairs + [""]
lines += ["Goals (issue 14): ping-pong at most 0.1x kernel; iperf3 at least 2x; redis GET and SET at least 1.5x;",
          "nginx+wrk at least 1.3x; fallback within 5% of kernel TCP."]
open(md, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
echo "wrote $out.md"
