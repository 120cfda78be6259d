#!/usr/bin/env bash
# Alternating rounds under SCHED_FIFO (chrt -f 10; other builds ran on both cores):
# cache-line hop + two-core handoff floor (8 and 32 slots of 64 KiB) + memcpy,
# the shm stream's 64 KiB bw (2 MiB ring), the bare SPSC ring floor. Pinned to cpus 0,1.
B=${1:-build}; n=${2:-8}
for r in $(seq 1 "$n"); do
  h=$(chrt -f 10 $B/bench/rdmakit-floors --json --sizes 65536 --handoff 65536 --handoff-slots 8,32 --rounds 1 | grep -E 'cacheline|handoff|memcpy' | grep -oE '"(half_rtt_ns|slots|bw_MBps)":[0-9.]*' | tr '\n' ' ')
  s=$(chrt -f 10 $B/bench/rdmakit-stream-bench bw --provider shm -s 65536 -D 1 --cpus 0,1 2>/dev/null | grep -o '"bw_MBps":[0-9.]*')
  f=$(chrt -f 10 $B/bench/rdmakit-stream-bench floor -s 65536 -D 1 --cpus 0,1 2>/dev/null | grep -o '"bw_MBps":[0-9.]*')
  echo "r$r floors $h | stream $s | spsc $f | load $(cut -d' ' -f1 /proc/loadavg)"
done
