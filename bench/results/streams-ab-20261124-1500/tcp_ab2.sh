#!/usr/bin/env bash
# Alternating under SCHED_FIFO: core write_bw tcp 1 MiB (new build's rdmakit-perf), old stream, new stream
rounds=$1; secs=$2
W=${W:-.}  # repo root; old build in build-old/b (git archive of the base commit), new in build
for r in $(seq 1 $rounds); do
  c=$(chrt -f 10 $W/build/tools/rdmakit-perf/rdmakit-perf write_bw --loopback --provider tcp -s 1048576 -D $secs --cpu 0 --json 2>/dev/null | grep '^{' | tail -1 | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["bw_avg_MBps"]))')
  o=$(chrt -f 10 $W/build-old/b/bench/rdmakit-stream-bench bw --provider tcp -s 1048576 -D $secs --cpus 0,1 2>/dev/null | grep '^{' | tail -1 | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["bw_MBps"]))')
  n=$(chrt -f 10 $W/build/bench/rdmakit-stream-bench bw --provider tcp -s 1048576 -D $secs --cpus 0,1 2>/dev/null | grep '^{' | tail -1 | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["bw_MBps"]))')
  echo "round $r core_write_bw=$c old_stream=$o ($(python3 -c "print(round($o/$c,3))")) new_stream=$n ($(python3 -c "print(round($n/$c,3))")) load=$(cut -d' ' -f1 /proc/loadavg)"
done
