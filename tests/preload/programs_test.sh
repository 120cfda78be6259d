#!/usr/bin/env bash
# Real Debian servers whose process shapes hand connections between
# processes, preloaded at both ends on loopback: programs_test.sh CASE RUN LIB
#   postgres  the postmaster forks a backend per connection; runs as a
#             service user. pgbench (4 clients) and psql; the pgbench
#             invariant is checked: the sum of the balances equals the sum
#             of the history's deltas. pg_basebackup -X stream (its forked
#             WAL receiver reads a non-blocking connection through a relay),
#             checked by pg_verifybackup.
#   sshd      sshd re-executes itself per connection, then forks its
#             privilege-separated children: ssh runs a command and scp copies
#             a file both ways, every byte checked.
# Every connection must take the shm path, adopted by the process that
# serves it or relayed through the one that carries it; none may fall back.
set -euo pipefail
case_name=$1 run=$(realpath "$2") lib=$(realpath "$3")
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/rdmakit-programs.XXXXXX)
chmod 755 "$work"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  [ -n "${pgdata:-}" ] && as_second_user /usr/lib/postgresql/*/bin/pg_ctl -D "$pgdata" -m immediate stop >/dev/null 2>&1
  second_user_remove 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL [$case_name]: $*" >&2; sed 's/^/  log: /' "$work/log" >&2 2>/dev/null || true; exit 1; }
need() { command -v "$1" >/dev/null || fail "$1 is not installed (scripts/deps.sh installs it)"; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
log=$work/log
: >"$log"
chmod 666 "$log"
count() { grep -cE "$1" "$log" || true; }
expect_no_fallback() {
  [ "$(count 'path=kernel|path=none')" = 0 ] || fail "connections off the fast path: $(grep -E 'path=kernel|path=none' "$log")"
}

case "$case_name" in
  postgres)
    pgbin=$(ls -d /usr/lib/postgresql/*/bin | tail -n 1)
    [ -x "$pgbin/postgres" ] || fail "postgresql is not installed (scripts/deps.sh installs it)"
    need pgbench; need psql
    . "$here/../support/second_user.sh"
    second_user_create || fail "no service user"
    # The service user's own copies: a checkout may sit in a 0700 directory.
    # (the library with the build's librdmakit it links, found through
    # LD_LIBRARY_PATH, which as_second_user sets to the staging directory)
    second_user_stage "$work/bin" "$run"; srun=$SECOND_USER_BIN
    second_user_stage "$work/lib" "$lib"; slib=$SECOND_USER_BIN
    pgdata=$work/pg; mkdir -m 700 "$pgdata" "$work/rdv" "$work/sock"
    chown "$SECOND_UID:$SECOND_GID" "$pgdata" "$work/rdv" "$work/sock"
    as_second_user "$pgbin/initdb" -D "$pgdata" -A trust -U bench >"$work/initdb.out" 2>&1 ||
      fail "initdb: $(tail -5 "$work/initdb.out")"
    port=$(free_port)
    pre=("$srun" --lib "$slib" --log "$log" --dir "$work/rdv")
    as_second_user "${pre[@]}" "$pgbin/pg_ctl" -D "$pgdata" -w -t 30 -l "$work/sock/pg.log" \
      -o "-p $port -k $work/sock -c listen_addresses=127.0.0.1 -c fsync=off" start >/dev/null ||
      fail "postgres did not start: $(tail -5 "$work/sock/pg.log")"
    pg() { as_second_user "${pre[@]}" timeout 120 "$@"; }
    pg pgbench -h 127.0.0.1 -p "$port" -U bench -i -s 2 postgres >"$work/init.out" 2>&1 ||
      fail "pgbench -i: $(tail -5 "$work/init.out")"
    pg pgbench -h 127.0.0.1 -p "$port" -U bench -c 4 -j 2 -t 300 postgres >"$work/bench.out" 2>&1 ||
      fail "pgbench: $(tail -5 "$work/bench.out")"
    grep -q "number of failed transactions: 0" "$work/bench.out" || fail "pgbench: $(cat "$work/bench.out")"
    q() { pg psql -h 127.0.0.1 -p "$port" -U bench -At -c "$1" postgres; }
    balances=$(q "select sum(abalance) from pgbench_accounts") || fail "psql"
    deltas=$(q "select sum(delta) from pgbench_history") || fail "psql"
    tellers=$(q "select sum(tbalance) from pgbench_tellers") || fail "psql"
    history=$(q "select count(*) from pgbench_history") || fail "psql"
    [ "$balances" = "$deltas" ] && [ "$tellers" = "$deltas" ] ||
      fail "pgbench invariant broken: accounts $balances, tellers $tellers, history $deltas"
    [ "$history" = 1200 ] || fail "history has $history rows, not 1200"
    # pg_basebackup -X stream uses its WAL connection, then forks the WAL
    # receiver, which reads it through a relay; libpq expects EAGAIN from it
    # (the relay socket must keep O_NONBLOCK, or the receiver blocks for good).
    mkdir -m 700 "$work/bk"; chown "$SECOND_UID:$SECOND_GID" "$work/bk"
    as_second_user "${pre[@]}" timeout 30 "$pgbin/pg_basebackup" -h 127.0.0.1 -p "$port" \
      -U bench -D "$work/bk/copy" -X stream -c fast >"$work/bk.out" 2>&1 ||
      fail "pg_basebackup -X stream: $(tail -5 "$work/bk.out")"
    as_second_user "$pgbin/pg_verifybackup" "$work/bk/copy" >"$work/verify.out" 2>&1 ||
      fail "pg_verifybackup: $(tail -5 "$work/verify.out")"
    [ "$(count "pg_basebackup\]: fork fd=[0-9]+ .*path=relay")" -ge 1 ] ||
      fail "pg_basebackup's WAL receiver was not relayed"
    # Each client connection and each backend that served one, on shm.
    clients=$(count "(pgbench|psql|pg_basebackup)\]: connect fd=[0-9]+ .*path=shm")
    backends=$(count "postgres\]: accept fd=[0-9]+ .*path=shm")
    [ "$clients" -ge 9 ] && [ "$clients" = "$backends" ] ||
      fail "$clients client and $backends backend connections on shm"
    # Adopted by the forked backends, never by the postmaster.
    postmaster=$(head -n 1 "$pgdata/postmaster.pid")
    [ "$(count "^rdmakit-preload\[$postmaster .*accept")" = 0 ] || fail "the postmaster kept a connection"
    expect_no_fallback
    # Clients of another user (root, its own rendezvous directory): pgbench
    # read-only and psql, on shm to backends of the service user.
    mkdir -m 700 "$work/rdv-root"
    before=$(wc -l <"$log")
    root_pg() { timeout 120 "$run" --log "$log" --dir "$work/rdv-root" "$@"; }
    root_pg pgbench -h 127.0.0.1 -p "$port" -U bench -n -S -c 2 -j 1 -t 100 postgres >"$work/root.out" 2>&1 ||
      fail "pgbench as root: $(tail -5 "$work/root.out")"
    rows=$(root_pg psql -h 127.0.0.1 -p "$port" -U bench -At -c "select count(*) from pgbench_history" postgres) ||
      fail "psql as root"
    [ "$rows" = 1200 ] || fail "psql as root read $rows rows"
    tail -n +"$((before + 1))" "$log" >"$work/root.log"
    xclients=$(grep -cE "(pgbench|psql)\]: connect fd=[0-9]+ .*path=shm" "$work/root.log" || true)
    xbackends=$(grep -cE "postgres\]: accept fd=[0-9]+ .*path=shm" "$work/root.log" || true)
    [ "$xclients" -ge 3 ] && [ "$xclients" = "$xbackends" ] ||
      fail "clients of another user: $xclients client and $xbackends backend connections on shm"
    expect_no_fallback
    echo "OK postgres: $clients connections on shm, sum of balances $balances = sum of deltas;" \
      "$xclients more from root to the service user's backends on shm"
    ;;
  sshd)
    [ -x /usr/sbin/sshd ] || fail "openssh-server is not installed (scripts/deps.sh installs it)"
    need ssh; need scp; need ssh-keygen
    mkdir -p /run/sshd; chmod 755 /run/sshd
    ssh-keygen -q -t ed25519 -N '' -f "$work/host" && ssh-keygen -q -t ed25519 -N '' -f "$work/user"
    cp "$work/user.pub" "$work/authorized_keys"
    port=$(free_port)
    cat >"$work/sshd_config" <<CFG
Port $port
ListenAddress 127.0.0.1
HostKey $work/host
AuthorizedKeysFile $work/authorized_keys
PidFile $work/sshd.pid
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
Subsystem sftp internal-sftp
CFG
    mkdir -m 700 "$work/rdv"
    pre=("$run" --log "$log" --dir "$work/rdv")
    "${pre[@]}" /usr/sbin/sshd -D -e -f "$work/sshd_config" >"$work/sshd.out" 2>&1 &
    pids+=($!)
    for _ in $(seq 200); do ss -ltn "sport = :$port" | grep -q LISTEN && break; sleep 0.05; done
    opts=(-i "$work/user" -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes -o LogLevel=ERROR)
    head -c 20000000 /dev/urandom >"$work/up"
    want=$(sha256sum <"$work/up" | cut -d' ' -f1)
    got=$("${pre[@]}" timeout 60 ssh "${opts[@]}" -p "$port" root@127.0.0.1 sha256sum <"$work/up" 2>"$work/ssh.err") ||
      fail "ssh: $(cat "$work/ssh.err") $(tail -5 "$work/sshd.out")"
    [ "${got%% *}" = "$want" ] || fail "ssh: remote digest $got, sent $want"
    "${pre[@]}" timeout 60 scp "${opts[@]}" -P "$port" "$work/up" "root@127.0.0.1:$work/remote" 2>"$work/scp.err" ||
      fail "scp up: $(cat "$work/scp.err")"
    "${pre[@]}" timeout 60 scp "${opts[@]}" -P "$port" "root@127.0.0.1:$work/remote" "$work/down" 2>>"$work/scp.err" ||
      fail "scp down: $(cat "$work/scp.err")"
    cmp -s "$work/up" "$work/remote" && cmp -s "$work/up" "$work/down" || fail "scp: files differ"
    clients=$(count "(ssh|scp)\]: connect fd=[0-9]+ .*path=shm")
    [ "$clients" = 3 ] || fail "$clients of 3 ssh connections on shm"
    # The re-executed sshd adopts; its privilege-separated children relay.
    [ "$(count "sshd[^]]*\]: accept fd=[0-9]+ .*path=shm")" = 3 ] || fail "sshd did not adopt 3 connections"
    [ "$(count "sshd[^]]*\]: (use|inherited|fork) fd=[0-9]+ .*path=relay")" -ge 3 ] || fail "no relayed sshd children"
    expect_no_fallback
    echo "OK sshd: ssh and scp (20 MB each way) over 3 shm connections"
    ;;
  *) fail "unknown case" ;;
esac
