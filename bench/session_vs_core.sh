#!/usr/bin/env bash
# The session layer's cost over the core, in one run: rdmakit-perf send_lat
# (8 B) and write_bw (64 KiB) --loopback against rdmakit-session-perf on the
# same provider, both ends pinned to CPUs 0 and 1 (session write_bw: lists of
# 16 WRITEs with one callback, as rdmakit-perf posts lists of 16). Writes
# bench/results/session-<date>/{raw.jsonl,summary.md}.
# Usage: bench/session_vs_core.sh [BUILD_DIR] [PROVIDERS...]   (default: build shm tcp)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
providers=("$@")
[ ${#providers[@]} -gt 0 ] || providers=(shm tcp)
perf=$build/tools/rdmakit-perf/rdmakit-perf
sperf=$build/bench/rdmakit-session-perf
[ -x "$perf" ] && [ -x "$sperf" ] || { echo "build rdmakit-perf and rdmakit-session-perf first"; exit 1; }
out=bench/results/session-$(date -u +%Y%m%d-%H%M%S)
mkdir -p "$out"
raw=$out/raw.jsonl
: >"$raw"
for p in "${providers[@]}"; do
  # WRITE runs of ~0.5 s or more: 20000 x 64 KiB take 40 ms on shm, too
  # short to rise above the noise of a shared machine.
  case $p in shm) wn=200000 ;; *) wn=40000 ;; esac
  "$perf" send_lat --loopback --provider "$p" -s 8 -n 20000 --cpu 0 --json 2>/dev/null |
    sed "s/^{/{\"api\":\"core\",/" >>"$raw"
  "$sperf" send_lat --provider "$p" -s 8 -n 20000 --cpu 0 --server-cpu 1 2>/dev/null >>"$raw"
  "$perf" write_bw --loopback --provider "$p" -s 65536 -n "$wn" --cpu 0 --json 2>/dev/null |
    sed "s/^{/{\"api\":\"core\",/" >>"$raw"
  "$sperf" write_bw --provider "$p" -s 65536 -n "$wn" --cpu 0 --server-cpu 1 2>/dev/null >>"$raw"
done
/usr/bin/python3 - "$raw" "$out/summary.md" <<'PY'
import json, sys, subprocess
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
def get(api, test, prov):
    for r in rows:
        if r.get("api") == api and r["test"] == test and r["provider"] == prov:
            return r
with open(sys.argv[2], "w") as f:
    load = open("/proc/loadavg").read().split()[:3]
    f.write("# Session layer vs core (same run, loopback, pinned CPUs 0/1)\n\n")
    f.write(f"Taken on a machine loaded by other builds (load average {' '.join(load)} on "
            f"{subprocess.check_output(['nproc']).decode().strip()} CPUs): compare ratios, "
            "not absolutes.\n\n")
    f.write("| provider | test | core | session | ratio | goal |\n|---|---|---|---|---|---|\n")
    for prov in sorted({r["provider"] for r in rows}):
        c, s = get("core", "send_lat", prov), get("session", "send_lat", prov)
        if c and s:
            f.write(f"| {prov} | SEND 8 B half RTT, typical (us) | {c['t_typical_us']:.3f} | "
                    f"{s['t_typical_us']:.3f} | {s['t_typical_us']/c['t_typical_us']:.2f}x | <= 1.15x |\n")
        c, s = get("core", "write_bw", prov), get("session", "write_bw", prov)
        if c and s:
            f.write(f"| {prov} | WRITE 64 KiB (MB/s) | {c['bw_avg_MBps']:.0f} | "
                    f"{s['bw_avg_MBps']:.0f} | {s['bw_avg_MBps']/c['bw_avg_MBps']:.2f}x | >= 0.95x |\n")
print(open(sys.argv[2]).read())
PY
echo "results in $out"
