#!/usr/bin/env bash
# Real servers under the preload against kernel TCP, same run, pinned
# (docs/preload.md, "Process shapes"). Rounds alternate the modes:
#   kernel   plain programs
#   shm      both ends under rdmakit-run (connections adopted by the process
#            that serves them, or relayed through the one that carries them)
# Rows:
#   pgbench   TPS, TPC-B-like, 4 clients, 2 threads, fsync off, scale 4
#             (PostgreSQL runs as the postgres user; each connection is
#             served by a forked backend)
#   ssh       MB/s of 1 GiB through `ssh host 'cat >/dev/null'` (sshd
#             re-executes itself per connection; its children relay)
#   scp       MB/s of a 1 GiB file copied up with scp
#   connrate  connections per second: redis-benchmark PING with a new
#             connection per request (-k 0), one client
#   setup     per-connection setup time (bench/preload_setup.c: connect, a
#             1-byte request and answer, close; one at a time): p50, p99,
#             max and the first connection's, in microseconds, and the rate
#   idle      file descriptors and resident memory per idle connection, N
#             connections held open between two Python processes
# Usage: bench/preload_programs.sh [BUILD_DIR]   (default: build)
#   RDMAKIT_BENCH_CPUS=0,1  RDMAKIT_BENCH_ROUNDS=3  RDMAKIT_BENCH_SECONDS=8
#   RDMAKIT_BENCH_ROWS="pgbench ssh scp connrate setup idle"  RDMAKIT_BENCH_IDLE_CONNS=1000
#   RDMAKIT_BENCH_SETUP_CONNS=2000  RDMAKIT_BENCH_BASE_LIB=/path/librdmakit-preload.so
#   (an earlier build: a "base" mode beside shm in the connrate and setup rows)
# Writes bench/results/programs-<UTC time>.md (raw outputs in .log).
set -u
cd "$(dirname "$0")/.."
build=$(realpath "${1:-build}")
cpus=${RDMAKIT_BENCH_CPUS:-0,1}
rounds=${RDMAKIT_BENCH_ROUNDS:-3}
secs=${RDMAKIT_BENCH_SECONDS:-8}
rows=${RDMAKIT_BENCH_ROWS:-pgbench ssh scp connrate setup idle}
setup_n=${RDMAKIT_BENCH_SETUP_CONNS:-2000}
# An earlier build's library, for the rows run as root (connrate, setup):
# before/after in the same run.
base_lib=${RDMAKIT_BENCH_BASE_LIB:+$(realpath "$RDMAKIT_BENCH_BASE_LIB")}
idle_n=${RDMAKIT_BENCH_IDLE_CONNS:-1000}
run=$build/tools/rdmakit-run/rdmakit-run
lib=$build/src/preload/librdmakit-preload.so
[ -x "$run" ] && [ -f "$lib" ] || { echo "missing $run or $lib"; exit 1; }
c_srv=${cpus#*,} c_cli=${cpus%,*}
stamp=$(date -u +%Y%m%d-%H%M%S)
out=$PWD/bench/results/programs-$stamp
: >"$out.log"
tmp=$(mktemp -d /tmp/rdmakit-bench-programs.XXXXXX)
chmod 755 "$tmp"
# The postgres user runs the server: it gets its own copies of the tools.
mkdir -m 755 "$tmp/bin"
cp "$run" "$lib" "$tmp/bin/"
for dep in $(ldd "$lib" | awk '$2 == "=>" && $3 ~ /^\// {print $3}'); do
  case $dep in /lib/* | /usr/*) ;; *) cp -L "$dep" "$tmp/bin/" ;; esac
done
chmod 755 "$tmp"/bin/*
export LD_LIBRARY_PATH=$tmp/bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
srun=$tmp/bin/rdmakit-run slib=$tmp/bin/$(basename "$lib")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  [ -d "$tmp/pg" ] && runuser -u postgres -- "$pgbin/pg_ctl" -D "$tmp/pg" -m immediate stop >/dev/null 2>&1
  rm -rf "$tmp"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_listen() { for _ in $(seq 200); do ss -ltn "sport = :$1" | grep -q LISTEN && return; sleep 0.05; done; }
pre() {  # pre MODE USER: the wrapper for a mode
  P=()
  [ "$1" = shm ] && P=("$srun" --lib "$slib" --dir "$tmp/rdv-$2" ${RDMAKIT_BENCH_RUN_ARGS:-})
  [ "$1" = base ] && P=("$srun" --lib "$base_lib" --dir "$tmp/rdv-$2" ${RDMAKIT_BENCH_RUN_ARGS:-})
  return 0
}
declare -A res

pgbin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | tail -n 1)
pgbench_row() {  # MODE: TPS
  local port; port=$(free_port)
  rm -rf "$tmp/pg" "$tmp/rdv-postgres"
  mkdir -m 700 "$tmp/pg" "$tmp/rdv-postgres"; chown postgres: "$tmp/pg" "$tmp/rdv-postgres"
  runuser -u postgres -- "$pgbin/initdb" -D "$tmp/pg" -A trust -U bench >>"$out.log" 2>&1
  pre "$1" postgres
  runuser -u postgres -- taskset -c "$c_srv" "${P[@]}" "$pgbin/pg_ctl" -D "$tmp/pg" -w -l "$tmp/pg/log" \
    -o "-p $port -k $tmp/pg -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off" \
    start >>"$out.log" 2>&1
  runuser -u postgres -- "${P[@]}" pgbench -h 127.0.0.1 -p "$port" -U bench -i -s 4 -q postgres >>"$out.log" 2>&1
  local o; o=$(runuser -u postgres -- taskset -c "$c_cli" "${P[@]}" pgbench -h 127.0.0.1 -p "$port" \
    -U bench -c 4 -j 2 -T "$secs" postgres 2>>"$out.log")
  echo "== pgbench $1" >>"$out.log"; echo "$o" >>"$out.log"
  runuser -u postgres -- "$pgbin/pg_ctl" -D "$tmp/pg" -m fast stop >>"$out.log" 2>&1
  echo "$o" | awk '/^tps =/ {print $3; found=1} END {if (!found) print "nan"}'
}

sshd_up() {  # MODE: starts sshd, sets ssh_port
  [ -f "$tmp/user" ] || {
    ssh-keygen -q -t ed25519 -N '' -f "$tmp/host"; ssh-keygen -q -t ed25519 -N '' -f "$tmp/user"
    cp "$tmp/user.pub" "$tmp/authorized_keys"; mkdir -p /run/sshd
    head -c 1073741824 /dev/urandom >"$tmp/gib"
  }
  ssh_port=$(free_port)
  printf '%s\n' "Port $ssh_port" "ListenAddress 127.0.0.1" "HostKey $tmp/host" \
    "AuthorizedKeysFile $tmp/authorized_keys" "PidFile $tmp/sshd.pid" "UsePAM no" \
    "StrictModes no" "PasswordAuthentication no" "Subsystem sftp internal-sftp" >"$tmp/sshd_config"
  mkdir -p -m 700 "$tmp/rdv-root"
  pre "$1" root
  taskset -c "$c_srv" "${P[@]}" /usr/sbin/sshd -D -f "$tmp/sshd_config" >>"$out.log" 2>&1 &
  sshd_pid=$!
  wait_listen "$ssh_port"
}
ssh_opts() { echo -i "$tmp/user" -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes -o LogLevel=ERROR; }
ssh_row() {  # MODE: MB/s
  sshd_up "$1"
  local t0 t1
  t0=$(date +%s.%N)
  # shellcheck disable=SC2046
  taskset -c "$c_cli" "${P[@]}" ssh $(ssh_opts) -p "$ssh_port" root@127.0.0.1 'cat >/dev/null' <"$tmp/gib" 2>>"$out.log"
  t1=$(date +%s.%N)
  kill "$sshd_pid"; wait "$sshd_pid" 2>/dev/null
  python3 -c "print('%.1f' % (1073.741824 / ($t1 - $t0)))"
}
scp_row() {  # MODE: MB/s
  sshd_up "$1"
  local t0 t1
  t0=$(date +%s.%N)
  # shellcheck disable=SC2046
  taskset -c "$c_cli" "${P[@]}" scp $(ssh_opts) -P "$ssh_port" "$tmp/gib" "root@127.0.0.1:$tmp/gib.copy" 2>>"$out.log"
  t1=$(date +%s.%N)
  kill "$sshd_pid"; wait "$sshd_pid" 2>/dev/null
  cmp -s "$tmp/gib" "$tmp/gib.copy" || { echo nan; return; }
  rm -f "$tmp/gib.copy"
  python3 -c "print('%.1f' % (1073.741824 / ($t1 - $t0)))"
}

connrate_row() {  # MODE: connections/s
  local port; port=$(free_port)
  mkdir -p -m 700 "$tmp/rdv-root"; pre "$1" root
  taskset -c "$c_srv" "${P[@]}" redis-server --port "$port" --bind 127.0.0.1 --save "" >>"$out.log" 2>&1 &
  local spid=$!
  wait_listen "$port"
  local o; o=$(taskset -c "$c_cli" "${P[@]}" redis-benchmark -p "$port" -t ping_inline -n 3000 -c 1 -k 0 --csv 2>>"$out.log")
  kill "$spid"; wait "$spid" 2>/dev/null
  echo "== connrate $1" >>"$out.log"; echo "$o" >>"$out.log"
  echo "$o" | python3 -c 'import csv,sys; r=[x for x in csv.reader(sys.stdin)]; print(r[1][1] if len(r) > 1 else "nan")'
}

setup_row() {  # MODE: "rate p50_us p99_us max_us first_us"
  mkdir -p -m 700 "$tmp/rdv-root"; pre "$1" root
  [ -x "$tmp/setup" ] || cc -O2 -Wall -o "$tmp/setup" bench/preload_setup.c || { echo nan; return; }
  rm -f "$tmp/setup.port"
  taskset -c "$c_srv" "${P[@]}" "$tmp/setup" server "$tmp/setup.port" "$setup_n" >>"$out.log" 2>&1 &
  local spid=$!
  for _ in $(seq 200); do [ -s "$tmp/setup.port" ] && break; sleep 0.05; done
  local o; o=$(taskset -c "$c_cli" "${P[@]}" "$tmp/setup" client "$(cat "$tmp/setup.port")" "$setup_n" 2>>"$out.log")
  wait "$spid"
  echo "== setup $1: $o" >>"$out.log"
  echo "${o:-nan}"
}

idle_row() {  # MODE: "fds_per_conn KiB_per_conn" (server side)
  local port; port=$(free_port)
  mkdir -p -m 700 "$tmp/rdv-root"; pre "$1" root
  cat >"$tmp/idle.py" <<'PY'
import os, socket, sys, time
role, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def mem():
    for line in open("/proc/self/smaps_rollup"):
        if line.startswith("Pss:"): return int(line.split()[1])
if role == "server":
    ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", port)); ls.listen(4096)
    first = ls.accept()[0]; first.recv(1)
    f0, m0 = len(os.listdir("/proc/self/fd")), mem()
    conns = []
    for _ in range(n):
        c = ls.accept()[0]; c.recv(1); conns.append(c)
    time.sleep(0.5)
    f1, m1 = len(os.listdir("/proc/self/fd")), mem()
    print("%.2f %.1f" % ((f1 - f0) / n, (m1 - m0) / n), flush=True)
    first.recv(1)
else:
    import resource
    h = resource.getrlimit(resource.RLIMIT_NOFILE)[1]; resource.setrlimit(resource.RLIMIT_NOFILE, (h, h))
    first = socket.create_connection(("127.0.0.1", port)); first.sendall(b"x")
    conns = []
    for _ in range(n):
        c = socket.create_connection(("127.0.0.1", port)); c.sendall(b"x"); conns.append(c)
    time.sleep(2)
    first.sendall(b"x")
PY
  (ulimit -n "$(ulimit -Hn)"; taskset -c "$c_srv" "${P[@]}" python3 "$tmp/idle.py" server "$port" "$idle_n" >"$tmp/idle.out" 2>>"$out.log") &
  local spid=$!
  wait_listen "$port"
  (ulimit -n "$(ulimit -Hn)"; taskset -c "$c_cli" "${P[@]}" timeout 300 python3 "$tmp/idle.py" client "$port" "$idle_n" 2>>"$out.log")
  wait "$spid"
  cat "$tmp/idle.out" 2>/dev/null || echo "nan nan"
}

for r in $(seq "$rounds"); do
  for row in $rows; do
    modes="kernel shm"
    case $row in connrate | setup) [ -n "$base_lib" ] && modes+=" base" ;; esac
    for m in $modes; do
      case $row in
        pgbench) res[pg_$m]+="$(pgbench_row $m);" ;;
        ssh) res[ssh_$m]+="$(ssh_row $m);" ;;
        scp) res[scp_$m]+="$(scp_row $m);" ;;
        connrate) res[cr_$m]+="$(connrate_row $m);" ;;
        setup) res[setup_$m]+="$(setup_row $m);" ;;
        idle) [ "$r" = 1 ] && res[idle_$m]+="$(idle_row $m);" ;;
      esac
    done
  done
  echo "round $r done" >&2
done
load=$(cut -d' ' -f1-3 /proc/loadavg)
{ for k in "${!res[@]}"; do echo "$k=${res[$k]}"; done; } >"$tmp/res"
python3 - "$out.md" "$stamp" "$cpus" "$rounds" "$load" "$tmp/res" "$idle_n" "$secs" "$setup_n" <<'PY'
import math, statistics as st, sys
md, stamp, cpus, rounds, load, resf, idle_n, secs, setup_n = sys.argv[1:]
res = dict(l.rstrip("\n").split("=", 1) for l in open(resf) if "=" in l)
def med(key, i=0):
    vals = []
    for r in res.get(key, "").split(";"):
        f = r.split()
        if len(f) > i and f[i] != "nan":
            vals.append(float(f[i]))
    return st.median(vals) if vals else math.nan
def ratio(a, b): return f"{a / b:.2f}x" if b and not math.isnan(a) and not math.isnan(b) else "n/a"
rows = [("pgbench TPS (4 clients, TPC-B-like, %s s)" % secs, "pg", 1.0),
        ("ssh 1 GiB to `cat >/dev/null`, MB/s", "ssh", None),
        ("scp 1 GiB up, MB/s", "scp", None),
        ("connections/s (redis-benchmark PING, new connection per request)", "cr", 0.9)]
lines = [f"# Real servers under the preload vs kernel TCP, {stamp} UTC", "",
         f"Pinned to CPUs {cpus} (server, client), median of {rounds} alternating rounds. "
         f"Load average at the end: {load}.", "",
         "| row | kernel TCP | preload (shm) | preload / kernel | goal |", "|---|---|---|---|---|"]
for name, key, goal in rows:
    k, s = med(key + "_kernel"), med(key + "_shm")
    if math.isnan(k) and math.isnan(s): continue
    lines.append(f"| {name} | {k:,.1f} | {s:,.1f} | {ratio(s, k)} | {'>= %.1fx' % goal if goal else ''} |")
    b = med(key + "_base")
    if not math.isnan(b):
        lines.append(f"| {name}, base library | {k:,.1f} | {b:,.1f} | {ratio(b, k)} | |")
sk = [med("setup_kernel", i) for i in range(5)]
ss = [med("setup_shm", i) for i in range(5)]
sb = [med("setup_base", i) for i in range(5)]
if not (math.isnan(sk[0]) and math.isnan(ss[0])):
    lines += ["", f"Connection setup, one connection at a time ({setup_n} per run; connect, a 1-byte "
              "request and answer, close; `bench/preload_setup.c`):", "",
              "| | connections/s | p50 us | p99 us | max us | first connection us |",
              "|---|---|---|---|---|---|",
              "| kernel TCP | " + " | ".join(f"{v:,.0f}" for v in sk) + " |",
              "| preload (shm) | " + " | ".join(f"{v:,.0f}" for v in ss) + " |"] + (
              ["| preload, base library | " + " | ".join(f"{v:,.0f}" for v in sb) + " |"]
              if not math.isnan(sb[0]) else []) + [
              f"| preload - kernel | {ratio(ss[0], sk[0])} | " +
              " | ".join(f"{a - b:+,.0f}" for a, b in zip(ss[1:], sk[1:])) + " |"]
fk, fs = med("idle_kernel", 0), med("idle_shm", 0)
mk, ms = med("idle_kernel", 1), med("idle_shm", 1)
if not (math.isnan(fk) and math.isnan(fs)):
    lines += ["", f"Idle connections ({idle_n}, server side): file descriptors per connection "
              f"kernel {fk:.2f}, preload {fs:.2f} (goal at most 2); proportional memory (Pss) per "
              f"connection kernel {mk:.1f} KiB, preload {ms:.1f} KiB (goal at most 64 KiB)."]
open(md, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
echo "wrote $out.md"
