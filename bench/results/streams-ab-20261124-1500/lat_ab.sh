#!/usr/bin/env bash
# Alternating rounds: core send_lat, old stream lat, new stream lat (shm 16 B, pinned 0,1)
rounds=${1:-4}; secs=${2:-2}
W=${W:-.}  # repo root; old build in build-old/b (git archive of the base commit), new in build
for r in $(seq 1 $rounds); do
  for v in old new; do
    if [ $v = old ]; then B=$W/build-old/b; else B=$W/build; fi
    c=$(chrt -f 10 $B/tools/rdmakit-perf/rdmakit-perf send_lat --loopback --provider shm -s 16 -D $secs --cpu 0 --json 2>/dev/null | grep '^{' | tail -1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["t_typical_us"])')
    s=$(chrt -f 10 $B/bench/rdmakit-stream-bench lat --provider shm -s 16 -D $secs --cpus 0,1 2>/dev/null | grep '^{' | tail -1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["half_rtt_us"])')
    echo "round $r $v core_send_lat=$c stream_half_rtt=$s ratio=$(python3 -c "print(round($s/$c,3))") load=$(cut -d' ' -f1 /proc/loadavg)"
  done
done
