#!/usr/bin/env bash
# Alternating A/B: shm 64 KiB streaming before (A: 7105d43^) and after (B: main) the ring
# rewind / lazy pages commit, with the bare SPSC floor and memcpy in each round.
# Usage: run.sh A_BUILD B_BUILD ROUNDS
A=$1; B=$2; n=${3:-6}
for r in $(seq 1 "$n"); do
  for tag in A B; do
    b=$A; [ $tag = B ] && b=$B
    echo "round $r $tag bw: $(nice -n -20 $b/bench/rdmakit-stream-bench bw --provider shm -s 65536 -D 1 --cpus 0,1 2>/dev/null | grep '^{' | tail -1)"
  done
  echo "round $r floor: $(nice -n -20 $B/bench/rdmakit-stream-bench floor -s 65536 -D 1 --cpus 0,1 2>/dev/null | grep '^{' | tail -1)"
  echo "round $r memcpy: $(nice -n -20 $B/bench/rdmakit-floors --json --cpus 0,1 --sizes 65536 2>/dev/null | grep '^{' | tail -1)"
  echo "round $r load: $(cut -d' ' -f1-3 /proc/loadavg)"
done
