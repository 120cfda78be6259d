#!/usr/bin/env bash
# Streams vs the core on verbs, side by side in one run (docs/streams.md):
# 1 MiB stream writes (rdmakit-stream-bench bw) against rdmakit-perf write_bw
# 1 MiB, alternating A B A B (3 rounds by default: a median of three, where
# two averaged one slow round in), both pinned to cpus 0 and 1, then the ratio
# of the medians (goal: stream >= 0.9x write_bw). Runs inside the one-VM
# Soft-RoCE run (guest-tests.sh), so the figures are emulated rxe under the
# VM's CPU, not a NIC's; the ratio is what the run checks is printed.
#   stream-bw-ratio.sh BUILD_DIR [ADDRESS]   (default address: $SOFTROCE_IP)
# Output: one "stream-bw-ratio: ..." line per run and a final summary line.
# Exit status: non-zero when a run fails or gives no figure (not when the
# ratio misses its goal: emulated figures are recorded, not judged).
set -u
build=$1
host=${2:-${SOFTROCE_IP:?address}}
secs=${RDMAKIT_STREAM_RATIO_SECONDS:-2}
rounds=${RDMAKIT_STREAM_RATIO_ROUNDS:-3}
provider=${RDMAKIT_STREAM_RATIO_PROVIDER:-verbs}  # tcp or shm: a check of this script on the host
perf=$build/tools/rdmakit-perf/rdmakit-perf
sbench=$build/bench/rdmakit-stream-bench
for b in "$perf" "$sbench"; do
  [ -x "$b" ] || { echo "stream-bw-ratio: missing $b"; exit 1; }
done
field() { sed -n "s/.*\"$1\":\([0-9.]*\).*/\1/p" | tail -1; }
port=7950
core=() stream=()
for round in $(seq "$rounds"); do
  port=$((port + 1))
  "$perf" write_bw --provider "$provider" --bind "$host" --port "$port" --accept-timeout 30 \
    --cpu 0 --timeout 20 >/dev/null 2>"/tmp/stream-bw-ratio.server.$round.log" &
  srv=$!
  c=$("$perf" write_bw "$host:$port" --provider "$provider" -s 1048576 -D "$secs" --cpu 1 \
    --timeout 20 --json 2>"/tmp/stream-bw-ratio.client.$round.log" | field bw_avg_MBps)
  wait "$srv"
  s=$("$sbench" bw --provider "$provider" --bind "$host" -s 1048576 -D "$secs" --cpus 1,0 \
    2>"/tmp/stream-bw-ratio.stream.$round.log" | field bw_MBps)
  echo "stream-bw-ratio: round $round: core write_bw ${c%.*} MB/s, stream ${s%.*} MB/s"
  if [ -z "$c" ] || [ -z "$s" ]; then
    cat /tmp/stream-bw-ratio.*."$round".log
    exit 1
  fi
  core+=("$c") stream+=("$s")
done
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
mc=$(median "${core[@]}") ms=$(median "${stream[@]}")
echo "stream-bw-ratio: $provider 1 MiB, $rounds alternating rounds of $secs s: stream $ms MB/s," \
  "core write_bw $mc MB/s, ratio $(awk -v a="$ms" -v b="$mc" 'BEGIN {printf "%.2f", a / b}')" \
  "(goal >= 0.9)"
