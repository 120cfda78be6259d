#!/usr/bin/env bash
# Alternating, one round after another: the two-core handoff floor (8 and 32
# slots of 64 KiB), the shm stream's 64 KiB bw (2 MiB ring), the bare SPSC
# ring floor, single-core memcpy. nice -20, pinned to cpus 0,1.
B=${1:-build}; n=${2:-6}
for r in $(seq 1 "$n"); do
  h=$(nice -n -20 $B/bench/rdmakit-floors --json --sizes 65536 --handoff 65536 --handoff-slots 8,32 --rounds 1 | grep -E 'handoff|memcpy' | grep -oE '"(slots|bw_MBps)":[0-9.]*' | tr '\n' ' ')
  s=$(nice -n -20 $B/bench/rdmakit-stream-bench bw --provider shm -s 65536 -D 1 --cpus 0,1 2>/dev/null | grep -o '"bw_MBps":[0-9.]*')
  f=$(nice -n -20 $B/bench/rdmakit-stream-bench floor -s 65536 -D 1 --cpus 0,1 2>/dev/null | grep -o '"bw_MBps":[0-9.]*')
  echo "r$r floors(handoff 8, handoff 32, memcpy) $h | stream $s | spsc $f | load $(cut -d' ' -f1 /proc/loadavg)"
done
