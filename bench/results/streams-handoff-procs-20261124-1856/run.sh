#!/usr/bin/env bash
# The two-core handoff floor (32 x 64 KiB) with its reader as a thread (T, the
# first version, built in T_BUILD) and as a forked process (P, committed), and
# the shm stream's 64 KiB bw, alternating, chrt -f 10, cpus 0,1.
T=$1; P=${2:-build}; n=${3:-5}
for r in $(seq 1 "$n"); do
  t=$(chrt -f 10 $T/bench/rdmakit-floors --json --sizes 8 --handoff 65536 --handoff-slots 32 --rounds 1 | grep -E 'cacheline|handoff' | grep -oE '"(half_rtt_ns|bw_MBps)":[0-9.]*' | tr '\n' ' ')
  p=$(chrt -f 10 $P/bench/rdmakit-floors --json --sizes 8 --handoff 65536 --handoff-slots 32 --rounds 1 | grep -E 'handoff' | grep -oE '"bw_MBps":[0-9.]*')
  s=$(chrt -f 10 $P/bench/rdmakit-stream-bench bw --provider shm -s 65536 -D 1 --cpus 0,1 2>/dev/null | grep -o '"bw_MBps":[0-9.]*')
  echo "r$r threads: $t | processes: $p | stream: $s | load $(cut -d' ' -f1 /proc/loadavg)"
done
