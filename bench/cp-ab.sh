#!/usr/bin/env bash
# Two rdmakit-cp binaries (e.g. before and after a change) on the tree of
# small files, side by side with rsync to an `rsync --daemon` on 127.0.0.1,
# and local `cp -a`, in alternating rounds (A-shm, B-shm, A-tcp, B-tcp, rsync,
# cp, then again), the receiving end pinned to CPU 0 and the sending end (and
# cp) to CPU 1, files in tmpfs.
#   bench/cp-ab.sh BINARY_A BINARY_B [LABEL_A LABEL_B]
# CP_BENCH_FILES (default 10000), CP_BENCH_ROUNDS (default 5); CP_AB_SET=big
# copies one CP_BENCH_BIG_MIB (default 2048) MiB file instead of the tree;
# CP_AB_PROVIDERS (default "shm tcp"); CP_AB_RSYNC=0 leaves rsync out.
# Results: bench/results/cp-ab-<date>.md and .csv.
set -euo pipefail
cd "$(dirname "$0")/.."
bin_a=$(realpath "${1:?binary A}"); bin_b=$(realpath "${2:?binary B}")
label_a=${3:-A}; label_b=${4:-B}
label_a=${label_a//,/;}; label_b=${label_b//,/;}  # the labels go into a CSV
nfiles=${CP_BENCH_FILES:-10000}
set_name=${CP_AB_SET:-small}
big_mib=${CP_BENCH_BIG_MIB:-2048}
rounds=${CP_BENCH_ROUNDS:-5}
providers=${CP_AB_PROVIDERS:-shm tcp}
with_rsync=${CP_AB_RSYNC:-1}
command -v rsync >/dev/null || { echo "rsync missing: scripts/deps.sh --bench"; exit 1; }
cpus=$(nproc); rx_cpu=0; tx_cpu=$((cpus > 1 ? 1 : 0))
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
work=$(mktemp -d /dev/shm/rdmakit-cp-ab.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT
mkdir -p "$work/src/small" "$work/dst"
src=$work/src/small; what="$nfiles small files"
if [ "$set_name" = big ]; then
  src=$work/src/big; what="a $big_mib MiB file"; nfiles=0
  head -c $((big_mib * 1024 * 1024)) /dev/urandom >"$src"
fi
python3 - "$work/src/small" "$nfiles" <<'PY'
import os, random, sys
root, n = sys.argv[1], int(sys.argv[2])
random.seed(1)
for i in range(n):
    d = os.path.join(root, "d%03d" % (i // 100))
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "f%05d" % i), "wb") as f:
        f.write(os.urandom(random.randint(1, 8192)))
PY
cpu_of() { awk -v hz="$(getconf CLK_TCK)" '{printf "%.3f", ($14 + $15 + $16 + $17) / hz}' "/proc/$1/stat"; }
declare -A server port
for v in a b; do
  for p in $providers; do
    b=$([ $v = a ] && echo "$bin_a" || echo "$bin_b")
    taskset -c $rx_cpu "$b" serve --root "$work/dst" -p 0 --port-file "$work/port.$v.$p" \
      --provider $p --bind 127.0.0.1 2>"$work/serve.$v.$p.log" &
    pids+=($!); server[$v.$p]=$!
    for _ in $(seq 100); do [ -s "$work/port.$v.$p" ] && break; sleep 0.05; done
    port[$v.$p]=$(cat "$work/port.$v.$p")
  done
done
rsync_port=$((20000 + $$ % 20000))
printf 'pid file = %s\nport = %s\nuse chroot = no\n[dst]\n  path = %s\n  read only = false\n  uid = %s\n  gid = %s\n' \
  "$work/rsyncd.pid" "$rsync_port" "$work/dst" "$(id -u)" "$(id -g)" >"$work/rsyncd.conf"
taskset -c $rx_cpu rsync --daemon --no-detach --config="$work/rsyncd.conf" &
rsync_pid=$!; pids+=($rsync_pid)
sleep 0.5
rows=()
one() {  # one TOOL ROUND SERVER_PID CMD...
  local tool=$1 round=$2 spid=$3; shift 3
  rm -rf "${work:?}/dst/"*
  local s0 s1 wall user sys
  s0=0 s1=0
  [ "$spid" = - ] || s0=$(cpu_of "$spid")
  /usr/bin/time -o "$work/time" -f "%e %U %S" taskset -c $tx_cpu "$@" >/dev/null 2>"$work/err" ||
    { echo "$tool failed:"; cat "$work/err"; return 1; }
  sleep 0.2
  [ "$spid" = - ] || s1=$(cpu_of "$spid")
  read -r wall user sys <"$work/time"
  rows+=("$tool,$round,$wall,$user,$sys,$(awk -v a="$s0" -v b="$s1" 'BEGIN{printf "%.2f", b - a}')")
  echo "  ${rows[-1]}"
}
for r in $(seq "$rounds"); do
  for p in $providers; do
    one "$label_a-$p" "$r" "${server[a.$p]}" "$bin_a" -q --provider $p -p "${port[a.$p]}" -r "$src" 127.0.0.1:.
    one "$label_b-$p" "$r" "${server[b.$p]}" "$bin_b" -q --provider $p -p "${port[b.$p]}" -r "$src" 127.0.0.1:.
  done
  [ "$with_rsync" = 0 ] ||
    one rsync-daemon "$r" "$rsync_pid" rsync -a "$src" "rsync://127.0.0.1:$rsync_port/dst/"
  one cp "$r" - cp -a "$src" "$work/dst/"
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
stamp=$(date -u +%Y%m%d-%H%M%S)
mkdir -p bench/results
csv=bench/results/cp-ab-$stamp.csv; md=bench/results/cp-ab-$stamp.md
{ echo "tool,round,wall_s,client_user_s,client_sys_s,server_cpu_s"; printf '%s\n' "${rows[@]}"; } >"$csv"
med() { sort -g | awk '{a[NR]=$1} END{print (NR % 2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
rs_med=$(printf '%s\n' "${rows[@]}" | awk -F, '$1=="rsync-daemon"{print $3}' | med)
cp_med=$(printf '%s\n' "${rows[@]}" | awk -F, '$1=="cp"{print $3}' | med)
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{if (a == "" || a == 0 || b == 0) print "-"; else printf "%.2fx", a / b}'; }
{
  echo "# rdmakit-cp A/B on $what, $stamp"
  echo
  echo "A = $label_a ($bin_a), B = $label_b ($bin_b)."
  echo "Host: $(uname -r), $cpus CPUs, load average $load_before before, $load_after after."
  if awk -v a="${load_before%% *}" -v b="${load_after%% *}" -v n="$cpus" 'BEGIN{exit !(a > n || b > n)}'; then
    echo
    echo "**Taken on a loaded machine** (load average above the $cpus CPUs): figures are noisy;"
    echo "the rounds alternate the tools so that the load hits all of them."
  fi
  echo
  echo "$rounds alternating rounds; medians of the rounds; receiver on CPU $rx_cpu, sender on CPU $tx_cpu,"
  echo "tmpfs, loopback. Every round: $csv."
  echo
  echo "cp runs on CPU $tx_cpu; its CPU time is in the client column. Ratios: median walls."
  echo
  echo "| tool | wall s (median) | wall s (best) | client cpu s (median) | server cpu s (median) | vs rsync | vs cp |"
  echo "|---|---|---|---|---|---|---|"
  tools=()
  for p in $providers; do tools+=("$label_a-$p" "$label_b-$p"); done
  [ "$with_rsync" = 0 ] || tools+=(rsync-daemon)
  tools+=(cp)
  for t in "${tools[@]}"; do
    w=$(printf '%s\n' "${rows[@]}" | awk -F, -v t="$t" '$1==t{print $3}' | med)
    best=$(printf '%s\n' "${rows[@]}" | awk -F, -v t="$t" '$1==t{print $3}' | sort -g | head -1)
    c=$(printf '%s\n' "${rows[@]}" | awk -F, -v t="$t" '$1==t{print $4 + $5}' | med)
    s=$(printf '%s\n' "${rows[@]}" | awk -F, -v t="$t" '$1==t{print $6}' | med)
    echo "| $t | $w | $best | $c | $s | $(ratio "$rs_med" "$w") | $(ratio "$cp_med" "$w") |"
  done
} >"$md"
cat "$md"
echo "written: $csv $md"
