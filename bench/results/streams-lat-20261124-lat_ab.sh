#!/bin/bash
cd /work/wt-stream-lat
export RDMAKIT_LOG=warn
R=${R:-3}
get() { python3 -c 'import json,sys
try: print("%.3f"%json.loads(sys.stdin.read().strip().splitlines()[-1])[sys.argv[1]])
except Exception: print("nan")' "$1"; }
for r in $(seq $R); do
  c=$(build/tools/rdmakit-perf/rdmakit-perf send_lat --loopback --provider shm -s 16 -D 1 --cpu 0 --json 2>>/tmp/lat-ab-err.log | get t_typical_us)
  oo=$(timeout 60 build-old/b/bench/rdmakit-stream-bench lat --provider shm -s 16 -D 1 --cpus 0,1 2>>/tmp/lat-ab-err.log); o=$(echo "$oo" | get half_rtt_us); ob=$(echo "$oo" | get best_half_rtt_us)
  n=$(timeout 60 build/bench/rdmakit-stream-bench lat --provider shm -s 16 -D 1 --cpus 0,1 2>>/tmp/lat-ab-err.log; echo "rc=$?" >> /tmp/lat-ab-err.log)
  nb=$(echo "$n" | get best_half_rtt_us); n=$(echo "$n" | get half_rtt_us)
  python3 -c "
c,o,n=float('$c'),float('$o'),float('$n')
print('round $r core %.3f old %.3f (%.2fx) best %s new %.3f (%.2fx) best %s load %s'%(c,o,o/c,'$ob',n,n/c,'$nb',open('/proc/loadavg').read().split()[0]))"
done
