#!/usr/bin/env bash
# shm 64 KiB streaming (2 MiB ring): the writer's copy into the peer's ring as
# memcpy (A) or with non-temporal stores (B), alternating, with the cache-line
# hop (the host's phase) and the handoff floors (memcpy / non-temporal writer)
# each round. RDMAKIT_SHM_STREAMING_WRITE_MIN=N streams WRITE_WITH_IMMs
# of at least N bytes.
B=${1:-build}; n=${2:-6}; pri=${PRI:-chrt -f 10}
for r in $(seq 1 "$n"); do
  fl=$($pri $B/bench/rdmakit-floors --json --sizes 65536 --handoff 65536 --handoff-slots 32 --handoff-nt --rounds 1 | grep -E 'cacheline|handoff|memcpy' | grep -oE '"(half_rtt_ns|floor|bw_MBps)":"?[0-9a-z_.]*' | tr '\n' ' ')
  a=$($pri $B/bench/rdmakit-stream-bench bw --provider shm -s 65536 -D 1 --cpus 0,1 2>/dev/null | grep -o '"bw_MBps":[0-9.]*')
  b=$(RDMAKIT_SHM_STREAMING_WRITE_MIN=16384 $pri $B/bench/rdmakit-stream-bench bw --provider shm -s 65536 -D 1 --cpus 0,1 2>/dev/null | grep -o '"bw_MBps":[0-9.]*')
  echo "r$r $fl | stream memcpy $a | stream nt $b | load $(cut -d' ' -f1 /proc/loadavg)"
done
