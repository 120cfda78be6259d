#!/usr/bin/env bash
# Alternating shm 16 B: core send_lat (rdmakit-perf --loopback, as bench/stream_compare.sh)
# and the stream's ping-pong half round trip, with the cache-line hop, nice -20, cpus 0,1.
B=${1:-build}; n=${2:-8}
for r in $(seq 1 "$n"); do
  hop=$(nice -n -20 $B/bench/rdmakit-floors --json --sizes 8 --rounds 1 | grep cacheline | grep -o '"half_rtt_ns":[0-9.]*')
  c=$(nice -n -20 $B/tools/rdmakit-perf/rdmakit-perf send_lat --loopback --provider shm -s 16 -D 1 --cpu 0 --json 2>/dev/null | grep -o '"t_typical_us":[0-9.]*')
  s=$(nice -n -20 $B/bench/rdmakit-stream-bench lat --provider shm -s 16 -D 1 --cpus 0,1 2>/dev/null | grep -o '"half_rtt_us":[0-9.]*')
  echo "r$r hop $hop | core $c | stream $s | load $(cut -d' ' -f1 /proc/loadavg)"
done
