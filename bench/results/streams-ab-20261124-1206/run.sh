#!/bin/bash
# Alternating before/after and baselines in one run. Two-process/two-thread runs under
# SCHED_FIFO (chrt -f 10, 1 s each, timeout 15) so other engineers' builds do not
# preempt them; memcpy (rdmakit-floors) at normal priority.
B=/work/wt-streams/build-bench; O=/tmp/streams-exp/before
rt() { timeout 15 chrt -f 10 "$@"; }
g() { sed -n "s/.*\"$1\":\([0-9.]*\).*/\1/p" | tail -1; }
for r in $(seq ${1:-3}); do
  fl=$($B/bench/rdmakit-floors --json --cpus 0,1 --sizes 65536 2>/dev/null)
  m=$(echo "$fl" | grep memcpy | g bw_MBps); mb=$(echo "$fl" | grep memcpy | g best_MBps)
  f=$(rt $B/bench/rdmakit-stream-bench floor -s 65536 -D 1 | g bw_MBps)
  of=$(LD_LIBRARY_PATH=$O rt $O/rdmakit-stream-bench floor -s 65536 -D 1 | g bw_MBps)
  sb=$(LD_LIBRARY_PATH=$O rt $O/rdmakit-stream-bench bw --provider shm -s 65536 -D 1 2>/dev/null | g bw_MBps)
  sa=$(rt $B/bench/rdmakit-stream-bench bw --provider shm -s 65536 -D 1 2>/dev/null | g bw_MBps)
  echo "bw round $r: memcpy $m (best $mb) floor_new $f floor_old $of stream_before $sb stream_after $sa MB/s; load $(cut -d' ' -f1 /proc/loadavg)"
  cb=$(LD_LIBRARY_PATH=$O rt $O/rdmakit-perf send_lat --loopback --provider shm -s 16 -D 1 --cpu 0 --json 2>/dev/null | grep '^{' | g t_typical_us)
  lb=$(LD_LIBRARY_PATH=$O rt $O/rdmakit-stream-bench lat --provider shm -s 16 -D 1 --cpus 0,1 2>/dev/null | g half_rtt_us)
  ca=$(rt $B/tools/rdmakit-perf/rdmakit-perf send_lat --loopback --provider shm -s 16 -D 1 --cpu 0 --json 2>/dev/null | grep '^{' | g t_typical_us)
  la=$(rt $B/bench/rdmakit-stream-bench lat --provider shm -s 16 -D 1 --cpus 0,1 2>/dev/null | g half_rtt_us)
  echo "lat round $r: before core_send_lat $cb stream $lb ratio $(awk -v a=$lb -v b=$cb 'BEGIN{printf "%.2f", a/b}'); after core_send_lat $ca stream $la ratio $(awk -v a=$la -v b=$ca 'BEGIN{printf "%.2f", a/b}') us; load $(cut -d' ' -f1 /proc/loadavg)"
done
