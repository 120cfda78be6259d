#!/usr/bin/env bash
# rdmakit-cp against rsync (to an `rsync --daemon` on 127.0.0.1, and over
# ssh) and local `cp -a`, side by side in one run, all in tmpfs (/dev/shm)
# so the disk does not dominate; the receiving end pinned to CPU 0, the
# sending end to CPU 1. Wall time and CPU time (user + system) of both ends
# are reported, with ratios against rsync and cp.
#   bench/cp-bench.sh [BUILD_DIR]       (default build-bench, built if missing)
# Sets:
#   big, small   a 2 GiB file and 10,000 small files into an empty destination:
#                rdmakit-cp shm and tcp (daemon), rsync daemon, cp -a, and for
#                the big file the destination's floor (its writing alone, dd).
#   tree-*       a real tree (Debian package contents: /usr/include and
#                /usr/share/doc, more if it has fewer than 30,000 entries),
#                synced as rsync does, each tool into a destination of its own:
#                rdmakit-cp shm, tcp (daemon) and -e ssh (tcp), rsync daemon,
#                rsync -e ssh, cp -a (first copy only). Rows: tree-first
#                (empty destination), tree-nochange (again, right after),
#                tree-1pct (1% of the regular files changed, seeded: half get a
#                line appended, half a few bytes overwritten in the middle,
#                same size, new mtime; the same changed source for every tool,
#                then restored). After each row every destination is compared
#                with the source (rsync -a -n -i --checksum --delete prints
#                nothing); a wrong tree makes the row FAIL.
#   floor        what a no-change sync cannot go under, in the same rounds:
#                walking and lstat()ing each tree (a C++ loop, and `find
#                -printf ''`), and the session setup (a copy of one empty file).
# The ssh rows need root (a private sshd on loopback, root login by a key made
# for the run) and /usr/sbin/sshd; without them they are left out and said so.
# Env: CP_BENCH_BIG_MIB (default 2048), CP_BENCH_FILES (default 10000),
# CP_BENCH_ROUNDS (default 3): rounds run the tools alternately (and in the
# tree rows in an order rotated every round), so that a change of load during
# the run hits every tool alike; the best and the median wall time of the
# rounds are reported. CP_BENCH_TREE=0 leaves the tree rows out;
# CP_BENCH_TREE_DIRS (default "/usr/include /usr/share/doc"),
# CP_BENCH_TREE_EXTRA (added one by one while the tree has fewer than
# CP_BENCH_TREE_MIN entries; default "/usr/share/locale /usr/lib/python3",
# 30000), CP_BENCH_CHANGE_PCT (1), CP_BENCH_SEED (1), CP_BENCH_SSH=0 (no ssh
# rows), CP_BENCH_TIMEOUT (seconds one command may take, 600).
# CP_BENCH_LANES (default "1 4"): rdmakit-cp rows with --lanes N besides the
# default ones (rdmakit-cp-shm-lanesN, rdmakit-cp-tcp-lanesN; the big, small
# and tree sets); "" leaves them out. CP_BENCH_NAME (default cp) names the
# results.
# Results: bench/results/cp-<date>.md (with `uptime` before and after: figures
# taken with a load above the number of CPUs are marked as such) and .csv
# (every round).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-bench}
big_mib=${CP_BENCH_BIG_MIB:-2048}
nfiles=${CP_BENCH_FILES:-10000}
repeat=${CP_BENCH_ROUNDS:-${CP_BENCH_REPEAT:-3}}
tree_on=${CP_BENCH_TREE:-1}
tree_dirs=${CP_BENCH_TREE_DIRS:-/usr/include /usr/share/doc}
tree_extra=${CP_BENCH_TREE_EXTRA:-/usr/share/locale /usr/lib/python3}
tree_min=${CP_BENCH_TREE_MIN:-30000}
change_pct=${CP_BENCH_CHANGE_PCT:-1}
seed=${CP_BENCH_SEED:-1}
ssh_on=${CP_BENCH_SSH:-1}
tmo=${CP_BENCH_TIMEOUT:-600}
lane_counts=${CP_BENCH_LANES-1 4}
result_name=${CP_BENCH_NAME:-cp}
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
uptime_before=$(uptime)
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
made_run_sshd=
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  [ -n "$made_run_sshd" ] && rmdir /run/sshd 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

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
# Symlinks must arrive as they are (the tree has absolute ones): without
# chroot rsyncd stores each as "/rsyncd-munged/TARGET" (munge symlinks), or
# with that off drops a leading "/" (its rule for a daemon that cannot
# chroot). So chroot when root; else absolute symlinks fail rsyncd's check.
rsync_chroot=$([ "$(id -u)" = 0 ] && echo yes || echo no)
cat >"$work/rsyncd.conf" <<EOF
pid file = $work/rsyncd.pid
port = $rsync_port
use chroot = $rsync_chroot
munge symlinks = no
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

rows=()  # set,tool,round,wall,user,sys,server_user,server_sys,status,phases
run() {  # run NAME DATASET ROUND SERVER_PID CMD...  -> one timed run
  local name=$1 set=$2 round=$3 spid=$4; shift 4
  rm -rf "${work:?}/dst/"* "$work/dst/".[!.]* 2>/dev/null || true
  sync
  local s0="0 0" s1="0 0"
  # rsync forks a child per connection: count the whole daemon tree.
  if [ "$spid" != - ]; then s0=$(tree_cpu "$spid"); fi
  /usr/bin/time -o "$work/time" -f "%e %U %S" taskset -c $tx_cpu timeout -k 5 "$tmo" "$@" >/dev/null \
    2>"$work/client.err" || { echo "$name failed:"; cat "$work/client.err"; tail -5 "$work"/serve.*.log; return 1; }
  sleep 0.2  # the daemon's per-connection child has exited
  if [ "$spid" != - ]; then s1=$(tree_cpu "$spid"); fi
  local wall user sys scpu
  read -r wall user sys <"$work/time"
  scpu=$(echo "$s0 $s1" | awk '{printf "%.2f,%.2f", $3 - $1, $4 - $2}')
  rows+=("$set,$name,$round,$wall,$user,$sys,$scpu,ok,")
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
    for n in $lane_counts; do
      run rdmakit-cp-shm-lanes$n $set "$round" "$server_shm" "$bin" -q --provider shm -p "$port_shm" --lanes $n $flag "$src" 127.0.0.1:.
      run rdmakit-cp-tcp-lanes$n $set "$round" "$server_tcp" "$bin" -q --provider tcp -p "$port_tcp" --lanes $n $flag "$src" 127.0.0.1:.
    done
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
rm -rf "${work:?}/dst/"* "$work/src/big" "$work/src/small"

# ---------------------------------------------------------------------------
# The real tree: first copy, nothing changed, 1% changed; and the floor.
declare -A checks=()   # "set,tool,round" -> ok | FAIL
declare -A failed=()   # "set,tool,round" -> 1 when the tool exited non-zero
check_notes=()         # the first differences of a failed check
tree_note=
ssh_note=
tree_tools=()
if [ "$tree_on" = 1 ]; then
  tsrc=$work/src/tree
  mkdir -p "$tsrc"
  echo "preparing the tree: $tree_dirs"
  for d in $tree_dirs; do cp -a "$d" "$tsrc/"; done
  tree_used=$tree_dirs
  tree_entries=$(find "$tsrc" -mindepth 1 | wc -l)
  for d in $tree_extra; do
    [ "$tree_entries" -ge "$tree_min" ] && break
    [ -d "$d" ] || continue
    cp -a "$d" "$tsrc/"
    tree_used="$tree_used $d"
    tree_entries=$(find "$tsrc" -mindepth 1 | wc -l)
  done
  tree_files=$(find "$tsrc" -type f | wc -l)
  tree_dirs_n=$(find "$tsrc" -mindepth 1 -type d | wc -l)
  tree_links=$(find "$tsrc" -type l | wc -l)
  tree_bytes=$(du -sb --apparent-size "$tsrc" | cut -f1)
  echo "tree: $tree_entries entries ($tree_files files, $tree_dirs_n directories, $tree_links symlinks), $tree_bytes bytes"
  [ "$tree_entries" -ge "$tree_min" ] ||
    tree_note="**The tree has only $tree_entries entries (fewer than $tree_min): nothing more to add on this machine.**"
  : >"$work/src/empty"

  # The lstat walk (the floor of a no-change sync on one end): C++ when a
  # compiler is here, else the same loop in Python.
  cat >"$work/walk.cpp" <<'EOF'
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <chrono>
#include <cstdio>
#include <cstring>
// Every entry lstat()ed (fstatat AT_SYMLINK_NOFOLLOW under its directory's fd).
static long walk(int dfd) {
  DIR* d = fdopendir(dfd);
  if (!d) { close(dfd); return 0; }
  long n = 0;
  while (dirent* e = readdir(d)) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    struct stat st;
    if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    ++n;
    if (S_ISDIR(st.st_mode)) {
      int c = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (c >= 0) n += walk(c);
    }
  }
  closedir(d);
  return n;
}
int main(int argc, char** argv) {
  if (argc != 2) return 1;
  auto t0 = std::chrono::steady_clock::now();
  int fd = open(argv[1], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) { perror(argv[1]); return 1; }
  long n = walk(fd);
  std::printf("%ld %.6f\n", n, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}
EOF
  cat >"$work/walk.py" <<'EOF'
import os, stat, sys, time
t0 = time.monotonic()
n = 0
stack = [sys.argv[1]]
while stack:
    d = stack.pop()
    for name in os.listdir(d):
        p = os.path.join(d, name)
        st = os.lstat(p)
        n += 1
        if stat.S_ISDIR(st.st_mode):
            stack.append(p)
print(n, "%.6f" % (time.monotonic() - t0))
EOF
  if c++ -O2 -o "$work/walk" "$work/walk.cpp" 2>/dev/null; then
    walker=("$work/walk"); walker_name="C++ (readdir + fstatat)"
  else
    walker=(python3 "$work/walk.py"); walker_name="Python (listdir + lstat)"
  fi

  # The private sshd for the -e ssh rows (root logs in with a key made here).
  ssh_user=$(id -un)
  if [ "$ssh_on" != 1 ]; then
    ssh_note="ssh rows left out (CP_BENCH_SSH=$ssh_on)."
  elif [ "$(id -u)" != 0 ] || [ ! -x /usr/sbin/sshd ] || ! command -v ssh >/dev/null ||
       ! command -v ssh-keygen >/dev/null; then
    ssh_note="ssh rows left out: they need root, /usr/sbin/sshd, ssh and ssh-keygen."
    sshd_pid=-
  else
    mkdir -p "$work/ssh"
    ssh-keygen -q -t ed25519 -N '' -f "$work/ssh/host_key"
    ssh-keygen -q -t ed25519 -N '' -f "$work/ssh/client_key"
    cp "$work/ssh/client_key.pub" "$work/ssh/authorized_keys"
    [ -d /run/sshd ] || { mkdir -m 755 /run/sshd && made_run_sshd=1; }
    sshd_pid=
    for _ in 1 2 3 4 5; do
      ssh_port=$((20000 + RANDOM % 40000))
      cat >"$work/ssh/sshd_config" <<EOF
Port $ssh_port
ListenAddress 127.0.0.1
HostKey $work/ssh/host_key
AuthorizedKeysFile $work/ssh/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
PermitRootLogin yes
StrictModes no
PidFile $work/ssh/sshd.pid
LogLevel ERROR
EOF
      taskset -c $rx_cpu /usr/sbin/sshd -D -f "$work/ssh/sshd_config" -E "$work/sshd.log" &
      sshd_pid=$!
      for _ in $(seq 100); do
        ss -ltn "sport = :$ssh_port" | grep -q LISTEN && break
        kill -0 "$sshd_pid" 2>/dev/null || break
        sleep 0.05
      done
      if kill -0 "$sshd_pid" 2>/dev/null && ss -ltn "sport = :$ssh_port" | grep -q LISTEN; then
        pids+=($sshd_pid); break
      fi
      kill "$sshd_pid" 2>/dev/null || true; wait "$sshd_pid" 2>/dev/null || true; sshd_pid=
    done
    rsh="ssh -p $ssh_port -i $work/ssh/client_key -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes -o LogLevel=ERROR"
    if [ -z "$sshd_pid" ]; then
      ssh_note="ssh rows left out: the private sshd did not start ($(tail -2 "$work/sshd.log" | tr '\n' ' '))."
    elif ! timeout 30 $rsh "$ssh_user@127.0.0.1" true </dev/null; then
      ssh_note="ssh rows left out: ssh to $ssh_user@127.0.0.1 failed ($(tail -2 "$work/sshd.log" | tr '\n' ' '))."
    fi
  fi
  [ -n "$ssh_note" ] && echo "$ssh_note"
  tree_tools=(rdmakit-cp-shm rdmakit-cp-tcp)
  for n in $lane_counts; do tree_tools+=(rdmakit-cp-shm-lanes$n rdmakit-cp-tcp-lanes$n); done
  [ -z "$ssh_note" ] && tree_tools+=(rdmakit-cp-ssh)
  tree_tools+=(rsync-daemon)
  [ -z "$ssh_note" ] && tree_tools+=(rsync-ssh)
  tree_tools+=(cp)

  # tool_cmd TOOL SRC DSTNAME: sets spid (whose CPU is the server's) and cmd.
  # DSTNAME is a directory under $work/dst; SRC lands in it under its own name.
  tool_cmd() {
    local t=$1 s=$2 d=$3
    case $t in
      rdmakit-cp-shm) spid=$server_shm
        cmd=("$bin" -a -q --provider shm -p "$port_shm" "$s" "127.0.0.1:$d") ;;
      rdmakit-cp-tcp) spid=$server_tcp
        cmd=("$bin" -a -q --provider tcp -p "$port_tcp" "$s" "127.0.0.1:$d") ;;
      rdmakit-cp-shm-lanes*) spid=$server_shm
        cmd=("$bin" -a -q --provider shm -p "$port_shm" --lanes "${t##*lanes}" "$s" "127.0.0.1:$d") ;;
      rdmakit-cp-tcp-lanes*) spid=$server_tcp
        cmd=("$bin" -a -q --provider tcp -p "$port_tcp" --lanes "${t##*lanes}" "$s" "127.0.0.1:$d") ;;
      rdmakit-cp-ssh) spid=$sshd_pid
        cmd=("$bin" -a -q --provider tcp -e "$rsh" --rdmakit-path "$bin" "$s" "$ssh_user@127.0.0.1:$work/dst/$d") ;;
      rsync-daemon) spid=$rsync_pid
        cmd=(rsync -a "$s" "rsync://127.0.0.1:$rsync_port/dst/$d/") ;;
      rsync-ssh) spid=$sshd_pid
        cmd=(rsync -a -e "$rsh" "$s" "$ssh_user@127.0.0.1:$work/dst/$d/") ;;
      cp) spid=-
        cmd=(cp -a "$s" "$work/dst/$d/") ;;
    esac
  }
  # Until the server has no child left (rsyncd's and sshd's per-connection
  # processes, reaped into the server's CPU times), at most 5 s.
  quiesce() {
    if [ "$1" != - ]; then
      for _ in $(seq 100); do pgrep -P "$1" >/dev/null || break; sleep 0.05; done
    fi
    sleep 0.2
  }
  # trun SET TOOL ROUND SERVER_PID CPU CMD...: one timed run (wall from the
  # clock around it, CPU from /usr/bin/time and the server's /proc), nothing
  # wiped; rdmakit-cp's phase times (RDMAKIT_CP_TIMING) kept.
  trun() {
    local set=$1 name=$2 round=$3 spid=$4 cpu=$5; shift 5
    local s0="0 0" s1="0 0" t0 t1 rc=0 wall user sys scpu phases status=ok
    [ "$spid" != - ] && s0=$(cpu_of "$spid")
    t0=$(date +%s%N)
    RDMAKIT_CP_TIMING=1 /usr/bin/time -o "$work/time" -f "%U %S" taskset -c "$cpu" \
      timeout -k 5 "$tmo" "$@" </dev/null >"$work/client.out" 2>"$work/client.err" || rc=$?
    t1=$(date +%s%N)
    quiesce "$spid"
    [ "$spid" != - ] && s1=$(cpu_of "$spid")
    wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.3f", (b - a) / 1e9}')
    read -r user sys < <(tail -1 "$work/time")
    scpu=$(echo "$s0 $s1" | awk '{printf "%.2f,%.2f", $3 - $1, $4 - $2}')
    phases=$( (grep -o 'timing: [a-z]* *[0-9.]* ms' "$work/client.err" || true) |
      awk '{printf "%s%s=%s", (NR > 1 ? ";" : ""), $2, $3}')
    if [ $rc != 0 ]; then
      status=exit$rc
      failed["$set,$name,$round"]=1
      echo "  $name ($set, round $round) failed with exit $rc:"; tail -5 "$work/client.err"
      check_notes+=("$set $name round $round: exit $rc: $(grep -v 'timing:' "$work/client.err" | tail -2 | tr '\n' ' ')")
    fi
    rows+=("$set,$name,$round,$wall,$user,$sys,$scpu,$status,$phases")
    echo "  $set,$name,$round,$wall,$user,$sys,$scpu,$status,$phases"
  }
  # check SET TOOL ROUND: the tool's copy of the tree equals the source
  # (names, kinds, modes, owners, times, link targets, bytes; nothing extra).
  check() {
    local key="$1,$2,$3" d=$work/dst/tree.$2/tree
    rsync -a -n -i --checksum --delete "$tsrc/" "$d/" >"$work/check.out" 2>&1 || true
    if [ -s "$work/check.out" ] || [ -n "${failed[$key]:-}" ]; then
      checks[$key]=FAIL
      if [ -s "$work/check.out" ]; then
        check_notes+=("$1 $2 round $3: $(wc -l <"$work/check.out") differences, first: $(head -3 "$work/check.out" | tr '\n' ';')")
      fi
      echo "  check $key: FAIL"; head -3 "$work/check.out"
    else
      checks[$key]=ok
    fi
  }
  # Changes CP_BENCH_CHANGE_PCT % of the regular files (of 16 bytes or more),
  # chosen with CP_BENCH_SEED: even ones get a line appended, odd ones 4 bytes
  # in the middle inverted (same size); all get the current time as mtime.
  # The originals go to $work/orig first; "restore" puts them back (bytes and
  # times), so every round starts from the same source.
  change_tree() {  # change | restore
    python3 - "$1" "$tsrc" "$work/orig" "$change_pct" "$seed" <<'EOF'
import json, os, random, shutil, stat, sys, time
mode, root, orig, pct, seed = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5])
index = os.path.join(orig, "index.json")
if mode == "restore":
    for b, p, atime, mtime in json.load(open(index)):
        shutil.copyfile(b, p)
        os.utime(p, ns=(atime, mtime))
    shutil.rmtree(orig)
    sys.exit(0)
regular, cands = 0, []
for dp, dns, fns in os.walk(root):
    for f in fns:
        p = os.path.join(dp, f)
        st = os.lstat(p)
        if stat.S_ISREG(st.st_mode):
            regular += 1
            if st.st_size >= 16:
                cands.append(p)
cands.sort()
k = max(2, round(regular * pct / 100))
chosen = random.Random(seed).sample(cands, k)
os.makedirs(orig)
saved, appended, edited = [], 0, 0
for i, p in enumerate(chosen):
    st = os.lstat(p)
    b = os.path.join(orig, str(i))
    shutil.copyfile(p, b)
    saved.append((b, p, st.st_atime_ns, st.st_mtime_ns))
    if i % 2 == 0:
        with open(p, "ab") as f:
            f.write(b"rdmakit-cp bench: a line appended (%d)\n" % i)
        appended += 1
    else:
        with open(p, "r+b") as f:
            mid = st.st_size // 2 - 2
            f.seek(mid)
            old = f.read(4)
            f.seek(mid)
            f.write(bytes(x ^ 0xFF for x in old))
        edited += 1
    now = time.time_ns()
    os.utime(p, ns=(now, now))
json.dump(saved, open(index, "w"))
print(k, appended, edited, regular)
EOF
  }

  # A round: fresh destinations, the tools in an order rotated by the round.
  for round in $(seq "$repeat"); do
    echo "tree round $round"
    rm -rf "$work/dst"/tree.* "$work/dst"/setup.*
    for t in "${tree_tools[@]}"; do mkdir -p "$work/dst/tree.$t"; done
    n=${#tree_tools[@]}
    order=()
    for i in $(seq 0 $((n - 1))); do order+=("${tree_tools[$(((i + round - 1) % n))]}"); done
    sync
    # First copy: every tool, cp -a included.
    for t in "${order[@]}"; do
      tool_cmd "$t" "$tsrc" "tree.$t"
      trun tree-first "$t" "$round" "$spid" $tx_cpu "${cmd[@]}"
    done
    for t in "${order[@]}"; do check tree-first "$t" "$round"; done
    # Nothing changed: the same again (cp -a is not a sync: left out).
    for t in "${order[@]}"; do
      [ "$t" = cp ] && continue
      tool_cmd "$t" "$tsrc" "tree.$t"
      trun tree-nochange "$t" "$round" "$spid" $tx_cpu "${cmd[@]}"
    done
    for t in "${order[@]}"; do [ "$t" = cp ] || check tree-nochange "$t" "$round"; done
    # The floor of a no-change sync: walking and lstat()ing each end's tree
    # (the source on the sender's CPU, a synced destination on the
    # receiver's), and the session setup: a copy of one empty file.
    for side in src dst; do
      if [ $side = src ]; then dir=$tsrc; cpu=$tx_cpu; else dir=$work/dst/tree.rdmakit-cp-tcp/tree; cpu=$rx_cpu; fi
      read -r _ secs < <(taskset -c $cpu "${walker[@]}" "$dir")
      rows+=("floor,walk-lstat-$side,$round,$secs,,,,,ok,")
      echo "  floor,walk-lstat-$side,$round,$secs"
      trun floor "find-$side" "$round" - $cpu find "$dir" -printf ''
    done
    # ssh alone: what every -e ssh run pays before its remote program starts.
    if [ -z "$ssh_note" ]; then
      trun floor setup-ssh-true "$round" "$sshd_pid" $tx_cpu $rsh "$ssh_user@127.0.0.1" true
    fi
    for t in "${order[@]}"; do
      [ "$t" = cp ] && continue
      rm -f "$work/dst/setup.$t"
      tool_cmd "$t" "$work/src/empty" "setup.$t"
      # the empty file lands as setup.TOOL itself: drop the trailing "/"
      # (rsync) or the directory it would go into.
      case $t in
        rsync-*) cmd[-1]=${cmd[-1]%/} ;;
      esac
      trun floor "setup-$t" "$round" "$spid" $tx_cpu "${cmd[@]}"
    done
    # 1% changed: the same changed source for every tool.
    read -r n_changed n_appended n_edited n_regular < <(change_tree change)
    echo "  changed $n_changed of $n_regular regular files ($n_appended appended, $n_edited edited in place)"
    for t in "${order[@]}"; do
      [ "$t" = cp ] && continue
      tool_cmd "$t" "$tsrc" "tree.$t"
      trun tree-1pct "$t" "$round" "$spid" $tx_cpu "${cmd[@]}"
    done
    for t in "${order[@]}"; do [ "$t" = cp ] || check tree-1pct "$t" "$round"; done
    change_tree restore
  done
fi

# Per set and tool: the round with the best wall time (its CPU times), and
# the median wall time of the rounds.
results=()
for set in big small; do
  tools="rdmakit-cp-shm rdmakit-cp-tcp"
  for n in $lane_counts; do tools="$tools rdmakit-cp-shm-lanes$n rdmakit-cp-tcp-lanes$n"; done
  tools="$tools rsync-daemon cp"
  [ $set = big ] && tools="$tools floor-write"
  for tool in $tools; do
    walls=$(printf '%s\n' "${rows[@]}" | awk -F, -v s=$set -v t=$tool '$1==s && $2==t {print $4}' | sort -g)
    median=$(echo "$walls" | awk '{a[NR]=$1} END{print (NR % 2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}')
    best=$(printf '%s\n' "${rows[@]}" | awk -F, -v s=$set -v t=$tool '$1==s && $2==t' | sort -t, -k4,4g | head -1)
    IFS=, read -r _ _ _ bwall buser bsys bsuser bssys _ <<<"$best"
    results+=("$set,$tool,$bwall,$buser,$bsys,$bsuser,$bssys,$median")
  done
done
stamp=$(date -u +%Y%m%d-%H%M%S)
mkdir -p bench/results
csv=bench/results/$result_name-$stamp.csv
md=bench/results/$result_name-$stamp.md
{
  echo "set,tool,round,wall_s,client_user_s,client_sys_s,server_user_s,server_sys_s,status,phases_ms,check"
  for r in "${rows[@]}"; do
    IFS=, read -r a b c _ <<<"$r"
    echo "$r,${checks["$a,$b,$c"]:--}"
  done
} >"$csv"
{
  echo "# rdmakit-cp bench $stamp"
  echo
  load_after=$(cut -d' ' -f1-3 /proc/loadavg)
  echo "Host: $(uname -r), $(nproc) CPUs, load average $load_before before, $load_after after."
  echo
  echo "\`uptime\` before: \`$uptime_before\`; after: \`$(uptime)\`."
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
      '$1==s {w = ($3 > 0 ? $3 : 0.005); m = ($8 > 0 ? $8 : 0.005)  # %e has 10 ms steps
        printf "| %s | %s | %s | %s | %.0f | %s | %s | %s | %s | %.2fx | %.2fx | %.2fx | %.2fx |\n", $1, $2, $3, $8, b/1048576/w, $4, $5, $6, $7, rs/w, cpw/w, rsm/m, cpm/m}'
  done
  if [ "$tree_on" = 1 ]; then
    echo
    TREE_USED=$tree_used TREE_ENTRIES=$tree_entries TREE_FILES=$tree_files TREE_DIRS=$tree_dirs_n \
    TREE_LINKS=$tree_links TREE_BYTES=$tree_bytes TREE_NOTE=$tree_note SSH_NOTE=$ssh_note \
    N_CHANGED=$n_changed N_APPENDED=$n_appended N_EDITED=$n_edited N_REGULAR=$n_regular \
    CHANGE_PCT=$change_pct SEED=$seed BIG_MIB=$big_mib RSYNC_CHROOT=$rsync_chroot WALKER=$walker_name ROUNDS=$repeat RX=$rx_cpu TX=$tx_cpu \
    CHECK_NOTES=$(printf '%s\n' "${check_notes[@]}") \
      python3 - "$csv" <<'EOF'
import csv, os, statistics, sys
E = os.environ
rows = list(csv.DictReader(open(sys.argv[1])))
def walls(s, t):
    return [float(r["wall_s"]) for r in rows if r["set"] == s and r["tool"] == t]
def med(s, t):
    w = walls(s, t)
    return statistics.median(w) if w else None
def best(s, t):
    w = walls(s, t)
    return min(w) if w else None
def best_row(s, t):
    rs = [r for r in rows if r["set"] == s and r["tool"] == t]
    return min(rs, key=lambda r: float(r["wall_s"])) if rs else None
def ok(s, t):
    rs = [r for r in rows if r["set"] == s and r["tool"] == t]
    bad = [r for r in rs if r["check"] != "ok" or r["status"] != "ok"]
    return (not bad, len(bad), len(rs))
def ratio(a, b):
    return "%.2fx" % (a / b) if a is not None and b else "n/a"
def phases(s, t):
    # median ms per phase of rdmakit-cp (RDMAKIT_CP_TIMING)
    acc = {}
    for r in rows:
        if r["set"] == s and r["tool"] == t and r["phases_ms"]:
            for kv in r["phases_ms"].split(";"):
                k, v = kv.split("=")
                acc.setdefault(k, []).append(float(v))
    return ", ".join("%s %.0f" % (k, statistics.median(v)) for k, v in acc.items())
lane_tools = sorted({r["tool"] for r in rows if "-lanes" in r["tool"]})
tools = [t for t in ["rdmakit-cp-shm", "rdmakit-cp-tcp"] + lane_tools +
         ["rdmakit-cp-ssh", "rsync-daemon", "rsync-ssh", "cp"] if walls("tree-first", t)]
sets = [("tree-first", "tree: first copy", 4.0), ("tree-nochange", "tree: nothing changed", 5.0),
        ("tree-1pct", "tree: 1% changed", 3.0)]
peer = {"rdmakit-cp-shm": "rsync-daemon", "rdmakit-cp-tcp": "rsync-daemon", "rdmakit-cp-ssh": "rsync-ssh"}
peer.update({t: "rsync-daemon" for t in lane_tools})
out = []
p = out.append
p("## Real tree")
p("")
p("Source: `cp -a %s` into tmpfs: %s entries (%s regular files, %s directories, %s symlinks), %s bytes."
  % (E["TREE_USED"], f"{int(E['TREE_ENTRIES']):,}", f"{int(E['TREE_FILES']):,}", f"{int(E['TREE_DIRS']):,}",
     f"{int(E['TREE_LINKS']):,}", f"{int(E['TREE_BYTES']):,}"))
if E.get("TREE_NOTE"):
    p(""); p(E["TREE_NOTE"])
p("Each tool syncs into a destination of its own, the tools in turn in an order rotated every round,"
  " %s rounds; receiver on CPU %s (daemons, sshd and what it starts), sender on CPU %s (the client,"
  " with its ssh). rdmakit-cp runs `-a -q` (`-a` as root also keeps owners, as rsync -a does);"
  " `-e ssh` with `--provider tcp`; rsync `-a` to its daemon and with"
  " `-e ssh` to a private sshd on 127.0.0.1 (its default cipher); `cp -a` copies only (first copy)."
  " rsyncd: `use chroot = %s`, `munge symlinks = no` (else it rewrites symlinks)."
  % (E["ROUNDS"], E["RX"], E["TX"], E["RSYNC_CHROOT"]))
p("Rows: first copy (empty destination); nothing changed (the same again right after); 1%% changed:"
  " %s of %s regular files changed (seed %s), %s with a line appended and %s with 4 bytes in the middle"
  " inverted (same size), all with a new mtime; the same changed source for every tool, restored after the row."
  % (E["N_CHANGED"], E["N_REGULAR"], E["SEED"], E["N_APPENDED"], E["N_EDITED"]))
p("Check after every row: `rsync -a -n -i --checksum --delete SRC/ DST/` prints nothing (names, kinds,"
  " modes, owners, mtimes, link targets, bytes, nothing extra); `FAIL` if any round's tree differed or"
  " the tool failed, and then its ratios do not count.")
if E.get("SSH_NOTE"):
    p(""); p("**" + E["SSH_NOTE"] + "**")
p("")
p("### Goals (like for like: rdmakit-cp's daemons against rsync's daemon, -e ssh against rsync -e ssh; ratios of the median walls, best walls in brackets)")
p("")
p("| row | rdmakit-cp | against | rdmakit-cp s | peer s | ratio | goal | met |")
p("|---|---|---|---|---|---|---|---|")
for tool in ["rdmakit-cp-shm", "rdmakit-cp-tcp"]:
    m, c = med("big", tool), med("big", "cp")
    if not m or not c:
        continue
    met = "yes" if c / m >= 0.9 else "no"
    p("| %s MiB file | %s | cp -a | %.2f | %.2f | %s (%s) | >= 0.9x | %s |"
      % (E["BIG_MIB"], tool[11:], m, c, ratio(c, m), ratio(best("big", "cp"), best("big", tool)), met))
for s, label, goal in sets:
    for tool in ["rdmakit-cp-shm", "rdmakit-cp-tcp", "rdmakit-cp-ssh"]:
        if tool not in tools:
            continue
        pr = peer[tool]
        m, q = med(s, tool), med(s, pr)
        good = ok(s, tool)[0] and ok(s, pr)[0]
        met = ("yes" if q / m >= goal else "no") if good else "FAIL"
        p("| %s | %s | %s | %.3f | %.3f | %s (%s) | >= %gx | %s |"
          % (label, tool[11:], pr, m, q, ratio(q, m), ratio(best(s, pr), best(s, tool)), goal, met))
p("")
p("### Every tool")
p("")
p("Wall seconds (median, best, every round in order); CPU seconds of the best round (client: the tool and"
  " its children, ssh included; server: the daemon, or sshd and what it ran); ratios rsync/tool"
  " (rsync daemon's and rsync -e ssh's wall over this tool's: above 1x the tool is faster), of the medians"
  " and of the best walls; rdmakit-cp's phases (`RDMAKIT_CP_TIMING=1`, medians in ms).")
p("")
p("| row | tool | check | wall median | wall best | rounds | client user+sys | server user+sys | vs rsync daemon | vs rsync ssh | vs rsync daemon (best) | vs rsync ssh (best) | phases ms |")
p("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for s, label, goal in sets:
    for tool in tools:
        if not walls(s, tool):
            if tool == "cp":
                p("| %s | cp | n/a | n/a (not a sync) | | | | | | | | | |" % label)
            continue
        good, nbad, n = ok(s, tool)
        chk = "ok" if good else "FAIL (%d/%d)" % (nbad, n)
        b = best_row(s, tool)
        rd, rs = med(s, "rsync-daemon"), med(s, "rsync-ssh")
        rounds = " ".join("%.2f" % w for w in walls(s, tool))
        srv = "-" if tool == "cp" else "%s+%s" % (b["server_user_s"], b["server_sys_s"])
        p("| %s | %s | %s | %.3f | %.3f | %s | %s+%s | %s | %s | %s | %s | %s | %s |"
          % (label, tool, chk, med(s, tool), best(s, tool), rounds, b["client_user_s"], b["client_sys_s"], srv,
             ratio(rd, med(s, tool)), ratio(rs, med(s, tool)),
             ratio(best(s, "rsync-daemon"), best(s, tool)), ratio(best(s, "rsync-ssh"), best(s, tool)),
             phases(s, tool)))
p("")
p("### The floor of \"nothing changed\"")
p("")
p("Measured in the same rounds, right after the nothing-changed row. A no-change sync must at least"
  " lstat every entry of the source (the sender) and of the destination (the receiver), and set up its"
  " session: the walks are a %s loop over the tree (the source pinned to the sender's CPU, rdmakit-cp"
  " tcp's synced destination to the receiver's) and `find DIR -printf ''` (readdir, few stats);"
  " setup is a whole run of the tool copying one empty file (process start, connect, authentication"
  " or ssh, close)." % E["WALKER"])
p("")
p("| what | median s | best s | rounds |")
p("|---|---|---|---|")
names = [("walk-lstat-src", "walk + lstat source"), ("walk-lstat-dst", "walk + lstat destination"),
         ("find-src", "find -printf '' source"), ("find-dst", "find -printf '' destination")]
names += [("setup-" + t, "setup: one empty file, " + t) for t in tools if t != "cp"]
names += [("setup-ssh-true", "setup: `ssh root@127.0.0.1 true` alone")]
for key, label in names:
    if walls("floor", key):
        p("| %s | %.3f | %.3f | %s |" % (label, med("floor", key), best("floor", key),
                                         " ".join("%.3f" % w for w in walls("floor", key))))
p("")
ws, wd = med("floor", "walk-lstat-src"), med("floor", "walk-lstat-dst")
p("Floor of a no-change sync = setup + the destination's walk: the receiver learns what to walk only"
  " once the session is up (the source's walk can overlap the setup, and both walks each other)."
  " Against it, the most a no-change sync can be faster than rsync:")
p("")
p("| rdmakit-cp | floor s (setup + walk dst) | nothing changed s (median) | above the floor | rsync peer s | most reachable vs rsync | goal |")
p("|---|---|---|---|---|---|---|")
for tool in ["rdmakit-cp-shm", "rdmakit-cp-tcp", "rdmakit-cp-ssh"]:
    if tool not in tools or med("floor", "setup-" + tool) is None:
        continue
    f = med("floor", "setup-" + tool) + wd
    m, q = med("tree-nochange", tool), med("tree-nochange", peer[tool])
    p("| %s | %.3f | %.3f | %+.3f | %.3f (%s) | %s | >= 5x |"
      % (tool[11:], f, m, m - f, q, peer[tool], ratio(q, f)))
    if tool == "rdmakit-cp-ssh" and med("floor", "setup-ssh-true") is not None:
        f = med("floor", "setup-ssh-true") + wd
        p("| ssh, setup = `ssh HOST true` | %.3f | %.3f | %+.3f | %.3f (%s) | %s | >= 5x |"
          % (f, m, m - f, q, peer[tool], ratio(q, f)))
notes = [l for l in E.get("CHECK_NOTES", "").split("\n") if l.strip()]
if notes:
    p("")
    p("### Failures")
    p("")
    for l in notes:
        p("- " + l.replace("|", "\\|"))
print("\n".join(out))
EOF
  fi
} >"$md"
cat "$md"
echo "written: $csv $md"
