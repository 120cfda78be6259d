#!/usr/bin/env bash
# shm 64 KiB streaming (2 MiB ring) with the receiver's CREDIT after half the
# ring (as main), after 1/8 and after 1/32 of it (64 KiB), alternating, with
# the cache-line hop (the host's phase) each round. EXP is a build whose engine
# reads the divisor from EXP_CREDIT_DIV (an experiment, not committed).
EXP=${1:-build-exp-src/build}; B=${2:-build}; n=${3:-8}; pri=${PRI:-nice -n -20}
for r in $(seq 1 "$n"); do
  hop=$($pri $B/bench/rdmakit-floors --json --sizes 8 --rounds 1 | grep cacheline | grep -o '"half_rtt_ns":[0-9.]*')
  line="r$r hop $hop"
  for div in 2 8 32; do
    v=$(EXP_CREDIT_DIV=$div $pri $EXP/bench/rdmakit-stream-bench bw --provider shm -s 65536 -D 1 --cpus 0,1 2>/dev/null | grep -o '"bw_MBps":[0-9.]*')
    line="$line | 1/$div $v"
  done
  echo "$line | load $(cut -d' ' -f1 /proc/loadavg)"
done
