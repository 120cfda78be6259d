#!/usr/bin/env bash
# The session layer's cost over the core, in one run: rdmakit-perf send_lat
# (8 B) and write_bw (64 KiB) --loopback against rdmakit-session-perf on the
# same provider, both ends pinned to CPUs 0 and 1 (session write_bw: lists of
# 16 WRITEs with one callback, as rdmakit-perf posts lists of 16). ROUNDS
# rounds (default 3), core and session alternating which goes first, so that a
# change in the machine's load falls on both; the summary takes the median of
# the rounds and gives each round's ratio too. Then the mesh setup time: 8
# ranks of rdmakit-mesh on shm (standalone bootstrap), ROUNDS times, if built.
# Writes bench/results/session-<date>/{raw.jsonl,summary.md}.
# Usage: [ROUNDS=N] bench/session_vs_core.sh [BUILD_DIR] [PROVIDERS...]   (default: build shm tcp)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
providers=("$@")
[ ${#providers[@]} -gt 0 ] || providers=(shm tcp)
rounds=${ROUNDS:-3}
perf=$build/tools/rdmakit-perf/rdmakit-perf
sperf=$build/bench/rdmakit-session-perf
mesh=$build/apps/mesh/rdmakit-mesh
[ -x "$perf" ] && [ -x "$sperf" ] || { echo "build rdmakit-perf and rdmakit-session-perf first"; exit 1; }
out=bench/results/session-$(date -u +%Y%m%d-%H%M%S)
mkdir -p "$out"
raw=$out/raw.jsonl
: >"$raw"
tag() { sed "s/^{/{\"round\":$1,/"; }
core() {  # core ROUND TEST PROVIDER SIZE ITERS
  "$perf" "$2" --loopback --provider "$3" -s "$4" -n "$5" --cpu 0 --json 2>/dev/null |
    sed "s/^{/{\"api\":\"core\",/" | tag "$1" >>"$raw"
}
session() {  # session ROUND TEST PROVIDER SIZE ITERS
  "$sperf" "$2" --provider "$3" -s "$4" -n "$5" --cpu 0 --server-cpu 1 2>/dev/null |
    tag "$1" >>"$raw"
}
for ((round = 1; round <= rounds; round++)); do
  for p in "${providers[@]}"; do
    # WRITE runs of ~0.5 s or more: 20000 x 64 KiB take 40 ms on shm, too
    # short to rise above the noise of a shared machine.
    case $p in shm) wn=200000 ;; *) wn=40000 ;; esac
    for t in "send_lat 8 20000" "write_bw 65536 $wn"; do
      set -- $t
      if ((round % 2)); then
        core "$round" "$1" "$p" "$2" "$3"; session "$round" "$1" "$p" "$2" "$3"
      else
        session "$round" "$1" "$p" "$2" "$3"; core "$round" "$1" "$p" "$2" "$3"
      fi
    done
  done
done
if [ -x "$mesh" ]; then
  port=$((22000 + ($$ % 4000)))
  for ((round = 1; round <= rounds; round++)); do
    pids=()
    for ((r = 0; r < 8; r++)); do
      o=()
      [ $r = 0 ] && o=(-o "$out/mesh-r$round")
      timeout 60 "$mesh" --rank $r --size 8 --root 127.0.0.1:$((port + round)) -p shm -t 0.3 \
        "${o[@]}" >"$out/mesh-r$round.rank$r.txt" 2>/dev/null &
      pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid" || true; done
    /usr/bin/python3 - "$out/mesh-r$round.json" "$round" >>"$raw" <<'PY' || true
import json, sys
d = json.load(open(sys.argv[1]))
print(json.dumps({"round": int(sys.argv[2]), "api": "mesh", "test": "setup", "provider": d.get("provider", "shm"),
                  "ranks": d["ranks"], "setup_ms": d["setup_ms"]}))
PY
    rm -f "$out"/mesh-r$round.rank[1-7].txt "$out/mesh-r$round.png"
  done
fi
/usr/bin/python3 - "$raw" "$out/summary.md" "$rounds" <<'PY'
import json, statistics, subprocess, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
rounds = int(sys.argv[3])
def vals(api, test, prov, key):
    return {r["round"]: r[key] for r in rows
            if r.get("api") == api and r["test"] == test and r["provider"] == prov and key in r}
with open(sys.argv[2], "w") as f:
    load = open("/proc/loadavg").read().split()[:3]
    f.write("# Session layer vs core (same run, loopback, pinned CPUs 0/1)\n\n")
    f.write(f"Taken on a machine loaded by other builds (load average {' '.join(load)} on "
            f"{subprocess.check_output(['nproc']).decode().strip()} CPUs at the end): compare "
            f"ratios, not absolutes. {rounds} rounds, core and session alternating which runs "
            "first; the table gives the medians of the rounds, and each round's ratio.\n\n")
    f.write("| provider | test | core | session | ratio of medians | per round | goal |\n"
            "|---|---|---|---|---|---|---|\n")
    for prov in sorted({r["provider"] for r in rows if r.get("api") in ("core", "session")}):
        for test, key, label, goal in (
                ("send_lat", "t_typical_us", "SEND 8 B half RTT, typical (us)", "<= 1.15x"),
                ("write_bw", "bw_avg_MBps", "WRITE 64 KiB (MB/s)", ">= 0.95x")):
            c, s = vals("core", test, prov, key), vals("session", test, prov, key)
            both = sorted(set(c) & set(s))
            if not both:
                continue
            cm, sm = statistics.median(c[k] for k in both), statistics.median(s[k] for k in both)
            per = ", ".join(f"{s[k] / c[k]:.2f}" for k in both)
            fmt = "{:.3f}" if test == "send_lat" else "{:.0f}"
            f.write(f"| {prov} | {label} | {fmt.format(cm)} | {fmt.format(sm)} | "
                    f"{sm / cm:.2f}x | {per} | {goal} |\n")
    m = [r["setup_ms"] for r in rows if r.get("api") == "mesh"]
    if m:
        f.write(f"\nrdmakit-mesh connection setup, 8 ranks on shm (standalone bootstrap, all 28 "
                f"pairs, slowest rank): median {statistics.median(m):.1f} ms, min {min(m):.1f}, "
                f"max {max(m):.1f} over {len(m)} runs.\n")
print(open(sys.argv[2]).read())
PY
echo "results in $out"
