#!/usr/bin/env bash
# rdmakit-cp against rsync (to an `rsync --daemon` on 127.0.0.1) and local
# `cp -a`, side by side in one run: a 2 GiB file and a tree of 10,000 small
# files, all in tmpfs (/dev/shm) so the disk does not dominate; the receiving
# end pinned to CPU 0, the sending end to CPU 1. Wall time and CPU time
# (user + system) of both ends are reported, with ratios against rsync and cp,
# and for the big file the destination's floor (its writing alone, dd).
#   bench/cp-bench.sh [BUILD_DIR]       (default build-bench, built if missing)
# CP_BENCH_BIG_MIB (default 2048), CP_BENCH_FILES (default 10000),
# CP_BENCH_ROUNDS (default 3): rounds run the tools alternately (shm, tcp,
# rsync, cp, then again), so that a change of load during the run hits every
# tool alike; the best and the median wall time of the rounds are reported.
# Results: bench/results/cp-<date>.md (with the load average before and
# after: figures taken with a load above the number of CPUs are marked as
# such) and .csv (every round).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-bench}
big_mib=${CP_BENCH_BIG_MIB:-2048}
nfiles=${CP_BENCH_FILES:-10000}
repeat=${CP_BENCH_ROUNDS:-${CP_BENCH_REPEAT:-3}}
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
if [ ! -x "$build/apps/cp/rdmakit-cp" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DRDMAKIT_BUILD_TESTS=OFF >/dev/null
  ninja -C "$build" -j2 rdmakit-cp >/dev/null
fi
bin=$(realpath "$build/apps/cp/rdmakit-cp")
command -v rsync >/dev/null || { echo "rsync missing: scripts/deps.sh --bench"; exit 1; }
cpus=$(nproc)
rx_cpu=0; tx_cpu=$((cpus > 1 ? 1 : 0))
work=$(mktemp -d /dev/shm/rdmakit-cp-bench.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

echo "preparing: ${big_mib} MiB file, $nfiles small files in $work"
mkdir -p "$work/src/small" "$work/dst"
head -c $((big_mib * 1024 * 1024)) /dev/urandom >"$work/src/big"
python3 - "$work/src/small" "$nfiles" <<'EOF'
import os, random, sys
root, n = sys.argv[1], int(sys.argv[2])
random.seed(1)
for i in range(n):
    d = os.path.join(root, "d%03d" % (i // 100))
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "f%05d" % i), "wb") as f:
        f.write(os.urandom(random.randint(1, 8192)))
EOF
small_bytes=$(du -sb "$work/src/small" | cut -f1)

cpu_of() {  # "user sys" seconds of a running pid and its reaped children (from /proc)
  awk -v hz="$(getconf CLK_TCK)" '{printf "%.3f %.3f", ($14 + $16) / hz, ($15 + $17) / hz}' "/proc/$1/stat"
}
# Servers: rdmakit-cp on shm and tcp, rsync daemon; each pinned to rx_cpu.
start_cp_server() {  # provider
  rm -f "$work/port.$1"
  taskset -c $rx_cpu "$bin" serve --root "$work/dst" -p 0 --port-file "$work/port.$1" \
    --provider "$1" --bind 127.0.0.1 2>"$work/serve.$1.log" &
  pids+=($!)
  eval "server_$1=$!"
  for _ in $(seq 100); do [ -s "$work/port.$1" ] && break; sleep 0.05; done
}
start_cp_server shm
start_cp_server tcp
rsync_port=$((20000 + $$ % 20000))
cat >"$work/rsyncd.conf" <<EOF
pid file = $work/rsyncd.pid
port = $rsync_port
use chroot = no
[dst]
  path = $work/dst
  read only = false
  uid = $(id -u)
  gid = $(id -g)
EOF
taskset -c $rx_cpu rsync --daemon --no-detach --config="$work/rsyncd.conf" &
rsync_pid=$!
pids+=($rsync_pid)
sleep 0.5

rows=()  # set,tool,round,wall,user,sys,server_user,server_sys
run() {  # run NAME DATASET ROUND SERVER_PID CMD...  -> one timed run
  local name=$1 set=$2 round=$3 spid=$4; shift 4
  rm -rf "${work:?}/dst/"* "$work/dst/".[!.]* 2>/dev/null || true
  sync
  local s0="0 0" s1="0 0"
  # rsync forks a child per connection: count the whole daemon tree.
  if [ "$spid" != - ]; then s0=$(tree_cpu "$spid"); fi
  /usr/bin/time -o "$work/time" -f "%e %U %S" taskset -c $tx_cpu "$@" >/dev/null \
    2>"$work/client.err" || { echo "$name failed:"; cat "$work/client.err"; tail -5 "$work"/serve.*.log; return 1; }
  sleep 0.2  # the daemon's per-connection child has exited
  if [ "$spid" != - ]; then s1=$(tree_cpu "$spid"); fi
  local wall user sys scpu
  read -r wall user sys <"$work/time"
  scpu=$(echo "$s0 $s1" | awk '{printf "%.2f,%.2f", $3 - $1, $4 - $2}')
  rows+=("$set,$name,$round,$wall,$user,$sys,$scpu")
  echo "  $set,$name,$round,$wall,$user,$sys,$scpu"
}
# CPU of a process and its reaped children (rsync's per-connection children
# are reaped by the daemon, so they are counted in its cutime/cstime).
tree_cpu() { cpu_of "$1"; }

port_shm=$(cat "$work/port.shm"); port_tcp=$(cat "$work/port.tcp")
echo "set,tool,round,wall_s,client_user_s,client_sys_s,server_user_s,server_sys_s"
for set in big small; do
  if [ $set = big ]; then src="$work/src/big"; flag=; else src="$work/src/small"; flag=-r; fi
  for round in $(seq "$repeat"); do
    run rdmakit-cp-shm $set "$round" "$server_shm" "$bin" -q --provider shm -p "$port_shm" $flag "$src" 127.0.0.1:.
    run rdmakit-cp-tcp $set "$round" "$server_tcp" "$bin" -q --provider tcp -p "$port_tcp" $flag "$src" 127.0.0.1:.
    run rsync-daemon $set "$round" "$rsync_pid" rsync -a "$src" "rsync://127.0.0.1:$rsync_port/dst/"
    run cp $set "$round" - cp -a "$src" "$work/dst/"
    # The destination's floor: only the writing of the file into tmpfs (page
    # allocation and the copy, from a zeroed buffer), which a receiver on one
    # CPU pays before anything else (receiving, verifying).
    if [ $set = big ]; then
      run floor-write $set "$round" - dd if=/dev/zero of="$work/dst/big" bs=1M count="$big_mib" status=none
    fi
  done
done
# Per set and tool: the round with the best wall time (its CPU times), and
# the median wall time of the rounds.
results=()
for set in big small; do
  tools="rdmakit-cp-shm rdmakit-cp-tcp rsync-daemon cp"
  [ $set = big ] && tools="$tools floor-write"
  for tool in $tools; do
    walls=$(printf '%s\n' "${rows[@]}" | awk -F, -v s=$set -v t=$tool '$1==s && $2==t {print $4}' | sort -g)
    median=$(echo "$walls" | awk '{a[NR]=$1} END{print (NR % 2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}')
    best=$(printf '%s\n' "${rows[@]}" | awk -F, -v s=$set -v t=$tool '$1==s && $2==t' | sort -t, -k4,4g | head -1)
    IFS=, read -r _ _ _ bwall buser bsys bsuser bssys <<<"$best"
    results+=("$set,$tool,$bwall,$buser,$bsys,$bsuser,$bssys,$median")
  done
done
stamp=$(date -u +%Y%m%d-%H%M%S)
mkdir -p bench/results
csv=bench/results/cp-$stamp.csv
md=bench/results/cp-$stamp.md
{ echo "set,tool,round,wall_s,client_user_s,client_sys_s,server_user_s,server_sys_s"; printf '%s\n' "${rows[@]}"; } >"$csv"
{
  echo "# rdmakit-cp bench $stamp"
  echo
  load_after=$(cut -d' ' -f1-3 /proc/loadavg)
  echo "Host: $(uname -r), $(nproc) CPUs, load average $load_before before, $load_after after."
  if awk -v a="${load_before%% *}" -v b="${load_after%% *}" -v n="$(nproc)" 'BEGIN{exit !(a > n || b > n)}'; then
    echo
    echo "**Taken on a loaded machine** (load average above the $(nproc) CPUs): every tool is"
    echo "slowed and the figures are noisy; the rounds alternate the tools so the ratios are fairer."
  fi
  echo
  echo "Big file: ${big_mib} MiB; small: $nfiles files, $small_bytes bytes. tmpfs, loopback,"
  echo "receiver on CPU $rx_cpu, sender on CPU $tx_cpu; $repeat alternating rounds; best round"
  echo "(wall and its CPU times), median wall of the rounds, ratios of the best walls and of the"
  echo "median walls."
  echo "cp has no server side (both ends are one process). floor-write (big file only) is"
  echo "\`dd if=/dev/zero bs=1M\` into tmpfs: the writing of the destination file alone, which"
  echo "a receiver on one CPU pays before it receives or verifies anything; its 'vs rsync' is the"
  echo "most any such copy can reach against rsync. Every round: $csv."
  echo
  echo "| set | tool | wall s (best) | wall s (median) | MiB/s | client user s | client sys s | server user s | server sys s | vs rsync | vs cp | vs rsync (medians) | vs cp (medians) |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
  for set in big small; do
    bytes=$([ $set = big ] && echo $((big_mib * 1024 * 1024)) || echo "$small_bytes")
    rs=$(printf '%s\n' "${results[@]}" | awk -F, -v s=$set '$1==s && $2=="rsync-daemon"{print $3}')
    cpw=$(printf '%s\n' "${results[@]}" | awk -F, -v s=$set '$1==s && $2=="cp"{print $3}')
    rsm=$(printf '%s\n' "${results[@]}" | awk -F, -v s=$set '$1==s && $2=="rsync-daemon"{print $8}')
    cpm=$(printf '%s\n' "${results[@]}" | awk -F, -v s=$set '$1==s && $2=="cp"{print $8}')
    printf '%s\n' "${results[@]}" | awk -F, -v s=$set -v b="$bytes" -v rs="$rs" -v cpw="$cpw" -v rsm="$rsm" -v cpm="$cpm" \
      '$1==s {printf "| %s | %s | %s | %s | %.0f | %s | %s | %s | %s | %.2fx | %.2fx | %.2fx | %.2fx |\n", $1, $2, $3, $8, b/1048576/$3, $4, $5, $6, $7, rs/$3, cpw/$3, rsm/$8, cpm/$8}'
  done
} >"$md"
cat "$md"
echo "written: $csv $md"
