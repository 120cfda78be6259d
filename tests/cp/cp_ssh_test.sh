#!/usr/bin/env bash
# rdmakit-cp -e ssh: no daemon; the client starts `rdmakit-cp --server` over
# ssh (a private sshd as root, a test user made with useradd -m).
#   cp_ssh_test.sh BINARY local    sshd on a free loopback port: push and pull,
#                                  the user's home and permissions, ssh failures,
#                                  a program that is not rdmakit-cp, no leftovers
#   cp_ssh_test.sh BINARY netns    sshd in a second network namespace; the client
#                                  in the first pushes and pulls over tcp
# Root only (sshd, useradd, ip netns): skipped (77) otherwise.
set -u
bin=${1:?binary}
mode=${2:?mode}
here=$(cd "$(dirname "$0")" && pwd)
if [ "$(id -u)" != 0 ]; then echo "skipped: needs root (sshd, useradd)"; exit 77; fi
for tool in /usr/sbin/sshd ssh ssh-keygen useradd userdel; do
  command -v $tool >/dev/null || { echo "FAIL: $tool missing (scripts/deps.sh installs it)"; exit 1; }
done
. "$here/../support/second_user.sh"  # second_user_stage
. "$here/../support/two_hosts.sh"
work=$(mktemp -d "${TMPDIR:-/tmp}/rdmakit-cp-ssh.XXXXXX")
chmod 711 "$work"  # the test user reaches the staged binary and the keys below it
tuser="rkssh$$"
tuser=${tuser:0:31}
sshd_pid=
holder_pid=
made_run_sshd=
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
pass() { echo "ok: $*"; }
cleanup() {
  [ -n "$holder_pid" ] && kill "$holder_pid" 2>/dev/null
  [ -n "$sshd_pid" ] && kill "$sshd_pid" 2>/dev/null
  if id "$tuser" >/dev/null 2>&1; then
    pkill -9 -u "$tuser" 2>/dev/null
    sleep 0.1
    userdel -r "$tuser" 2>/dev/null
  fi
  two_hosts_down
  [ -n "$made_run_sshd" ] && rmdir /run/sshd 2>/dev/null
  wait 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

# The test user: a home, a shell, an unlocked account (sshd refuses a '!'
# password without PAM), and a copy of the binary it can run.
useradd -m -s /bin/sh "$tuser" || { echo "FAIL: useradd $tuser"; exit 1; }
usermod -p '*' "$tuser"
home=$(getent passwd "$tuser" | cut -d: -f6)
second_user_stage "$work/stage" "$bin" || { echo "FAIL: staging the binary"; exit 1; }
# Passed to the remote shell as is (as rsync's --rsync-path): the staged
# libraries come with it.
prog="env LD_LIBRARY_PATH=$work/stage $work/stage/$(basename "$bin")"

mkdir -p "$work/ssh" && chmod 755 "$work/ssh"
ssh-keygen -q -t ed25519 -N '' -f "$work/ssh/host_key" || exit 1
ssh-keygen -q -t ed25519 -N '' -f "$work/ssh/client_key" || exit 1
ssh-keygen -q -t ed25519 -N '' -f "$work/ssh/wrong_key" || exit 1
cp "$work/ssh/client_key.pub" "$work/ssh/authorized_keys"
chmod 644 "$work/ssh/authorized_keys"
[ -d /run/sshd ] || { mkdir -m 755 /run/sshd && made_run_sshd=1; }

start_sshd() {  # start_sshd ADDRESS PORT [NETNS]: true once it listens
  local addr=$1 port=$2 ns=${3:-}
  cat >"$work/ssh/sshd_config" <<EOF
Port $port
ListenAddress $addr
HostKey $work/ssh/host_key
AuthorizedKeysFile $work/ssh/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
PermitRootLogin no
StrictModes no
PidFile $work/ssh/sshd.pid
LogLevel ERROR
EOF
  local run=()
  [ -n "$ns" ] && run=(ip netns exec "$ns")
  "${run[@]}" /usr/sbin/sshd -D -f "$work/ssh/sshd_config" -E "$work/sshd.log" &
  sshd_pid=$!
  for _ in $(seq 100); do
    "${run[@]}" ss -ltn "sport = :$port" | grep -q LISTEN && return 0
    kill -0 "$sshd_pid" 2>/dev/null || break
    sleep 0.05
  done
  kill "$sshd_pid" 2>/dev/null
  wait "$sshd_pid" 2>/dev/null
  sshd_pid=
  return 1
}

make_tree() {
  local t=$1
  mkdir -p "$t/sub/deeper" "$t/empty dir"
  : >"$t/empty"
  echo hello >"$t/small.txt"
  head -c $((3 * 1024 * 1024 + 17)) /dev/urandom >"$t/sub/deeper/multi"
  for i in $(seq 1 20); do head -c $((i * 97)) /dev/urandom >"$t/sub/f$i"; done
  echo "with space" >"$t/name with space"
  ln -s small.txt "$t/link"
  chmod 600 "$t/small.txt"
}
same_tree() {  # names, kinds, modes, sizes, mtimes and bytes
  local a b
  a=$(cd "$1" && find . -mindepth 1 -printf '%p %y %m %s %T@ %l\n' | LC_ALL=C sort)
  b=$(cd "$2" && find . -mindepth 1 -printf '%p %y %m %s %T@ %l\n' | LC_ALL=C sort)
  [ "$a" = "$b" ] || { diff <(echo "$a") <(echo "$b") | head -5; return 1; }
  diff -r --no-dereference "$1" "$2" >/dev/null
}
no_server_left() {  # [PATTERN]: no `rdmakit-cp --server` of the test user (bounded wait)
  local pattern=${1:-"$(basename "$bin") --server"}
  for _ in $(seq 40); do
    pgrep -u "$tuser" -f -- "$pattern" >/dev/null || return 0
    sleep 0.05
  done
  pgrep -a -u "$tuser" -f -- "$pattern"
  return 1
}

src=$work/src
mkdir -p "$src" "$work/pulled"
make_tree "$src/tree"

case $mode in
  local)
    port=
    for _ in 1 2 3 4 5; do
      p=$((20000 + RANDOM % 40000))
      start_sshd 127.0.0.1 $p && { port=$p; break; }
    done
    [ -n "$port" ] || { echo "FAIL: sshd did not start"; cat "$work/sshd.log"; exit 1; }
    rsh_base="ssh -p $port -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes -o LogLevel=ERROR"
    rsh="$rsh_base -i $work/ssh/client_key"
    at=$tuser@127.0.0.1
    cp_() { timeout --kill-after=5 30 "$bin" -q -e "$rsh" --rdmakit-path "$prog" "$@"; }

    # A server nobody connects to leaves after 30 s (started first, checked
    # last): its stdin stays open, held by a writer on a fifo. A program name
    # of its own keeps it apart from the servers the copies start.
    ln "$work/stage/$(basename "$bin")" "$work/stage/idle-server"
    mkfifo "$work/idle.in"
    sleep 55 >"$work/idle.in" &
    holder_pid=$!
    (
      t=$(date +%s)
      timeout 50 ssh -p "$port" -i "$work/ssh/client_key" -o StrictHostKeyChecking=no \
        -o UserKnownHostsFile=/dev/null -o BatchMode=yes -o LogLevel=ERROR "$at" \
        "${prog%/*}/idle-server --server --push --provider tcp" <"$work/idle.in" >"$work/idle.out" 2>"$work/idle.err"
      echo "$? $(($(date +%s) - t))" >"$work/idle.rc"
    ) &
    idle_pid=$!

    # Push a tree to a relative path: it lands in the user's home, as the user.
    cp_ -r "$src/tree" "$at:." && pass "push -r exit 0" || fail "push -r"
    same_tree "$src/tree" "$home/tree" && pass "push: tree identical in the user's home" ||
      fail "push: trees differ"
    others=$(find "$home/tree" ! -user "$tuser" | wc -l)
    [ "$others" = 0 ] && pass "push: every entry owned by $tuser" || fail "push: $others entries not owned by $tuser"
    no_server_left && pass "push: the remote server exited" || fail "push: a remote server is left"
    # Pull it back.
    cp_ -r "$at:tree" "$work/pulled" && same_tree "$src/tree" "$work/pulled/tree" &&
      pass "pull -r: tree identical" || fail "pull -r"
    no_server_left && pass "pull: the remote server exited" || fail "pull: a remote server is left"
    # Over three lanes (the remote server grants up to 8 to its one client).
    out=$(cp_ --lanes 3 --json -r "$src/tree" "$at:lanes")
    if echo "$out" | grep -q '"lanes": 3' && same_tree "$src/tree" "$home/lanes"; then
      pass "push over 3 lanes: tree identical"
    else fail "push over 3 lanes: $out"; fi
    cp_ --lanes 3 -r "$at:lanes" "$work/pulled-lanes" && same_tree "$src/tree" "$work/pulled-lanes" &&
      pass "pull over 3 lanes: tree identical" || fail "pull over 3 lanes"
    no_server_left && pass "lanes: the remote server exited" || fail "lanes: a remote server is left"
    # An absolute path, and a single file to a new name.
    cp_ -r "$src/tree" "$at:$home/abs" && same_tree "$src/tree" "$home/abs" &&
      pass "push to an absolute path" || fail "push to an absolute path"
    cp_ "$src/tree/small.txt" "$at:renamed.txt" && cmp -s "$src/tree/small.txt" "$home/renamed.txt" &&
      pass "a file to a new relative name" || fail "a file to a new relative name"
    # A directory the user cannot write: exit 2, the reason given, nothing there.
    mkdir -m 755 "$work/locked"
    cp_ -r "$src/tree" "$at:$work/locked/x" 2>"$work/err"
    rc=$?
    if [ $rc = 2 ] && grep -qi "permission denied" "$work/err" && [ -z "$(ls -A "$work/locked")" ]; then
      pass "unwritable destination: exit 2, permission denied"
    else fail "unwritable destination: exit $rc"; cat "$work/err"; fi
    # Setuid: dropped by the receiving server unless --preserve-special.
    echo x >"$work/suid"; chmod 4755 "$work/suid"
    cp_ "$work/suid" "$at:suid-dropped" && cp_ --preserve-special "$work/suid" "$at:suid-kept"
    if [ "$(stat -c %a "$home/suid-dropped")" = 755 ] && [ "$(stat -c %a "$home/suid-kept")" = 4755 ] &&
       [ "$(stat -c %U "$home/suid-kept")" = "$tuser" ]; then
      pass "setuid dropped by default, kept with --preserve-special (owned by $tuser)"
    else fail "setuid: $(stat -c %a "$home/suid-dropped" "$home/suid-kept" | tr '\n' ' ')"; fi
    # A key sshd does not accept: ssh fails, exit 5, ssh's own error shown.
    timeout 30 "$bin" -q -e "$rsh_base -i $work/ssh/wrong_key" --rdmakit-path "$prog" \
      "$src/tree/small.txt" "$at:never" 2>"$work/err"
    rc=$?
    if [ $rc = 5 ] && grep -q "Permission denied (publickey" "$work/err" &&
       grep -q "ssh exited with status 255 before the server answered" "$work/err" && [ ! -e "$home/never" ]; then
      pass "wrong key: exit 5, ssh's error and its status"
    else fail "wrong key: exit $rc"; cat "$work/err"; fi
    # A remote program that is not rdmakit-cp: a clear error at once, exit 5.
    t0=$SECONDS
    timeout 30 "$bin" -q -e "$rsh" --rdmakit-path /bin/echo "$src/tree/small.txt" "$at:never" 2>"$work/err"
    rc=$?
    if [ $rc = 5 ] && [ $((SECONDS - t0)) -lt 10 ] && grep -q "instead of a bootstrap line" "$work/err"; then
      pass "--rdmakit-path /bin/echo: exit 5 in $((SECONDS - t0)) s, not a bootstrap line"
    else fail "--rdmakit-path /bin/echo: exit $rc after $((SECONDS - t0)) s"; cat "$work/err"; fi
    # A host that would be an ssh option is refused before ssh runs.
    timeout 30 "$bin" -q -e "$rsh" -- "$src/tree/small.txt" "-oProxyCommand=false:x" 2>"$work/err"
    rc=$?
    [ $rc = 1 ] && grep -q "not a host name" "$work/err" &&
      pass "a host starting with '-' is refused before ssh runs (exit 1)" ||
      { fail "host starting with '-': exit $rc"; cat "$work/err"; }
    # -p and --secret-file belong to a daemon.
    timeout 30 "$bin" -q -e "$rsh" -p 7480 "$src/tree/small.txt" "$at:never" 2>"$work/err"
    [ $? = 1 ] && grep -q "are for a daemon" "$work/err" && pass "-e with -p: usage error" || fail "-e with -p"
    # The server leaves when its stdin (the ssh channel) closes.
    t0=$SECONDS
    timeout 30 ssh -p "$port" -i "$work/ssh/client_key" -o StrictHostKeyChecking=no \
      -o UserKnownHostsFile=/dev/null -o BatchMode=yes -o LogLevel=ERROR "$at" \
      "$prog --server --pull --provider tcp" </dev/null >"$work/out" 2>"$work/err"
    rc=$?
    if [ $rc = 5 ] && grep -q "^rdmakit-cp-bootstrap 1 tcp 127.0.0.1 [0-9]* [0-9a-f]\{64\}$" "$work/out" &&
       grep -q "input closed before a client came" "$work/err" && [ $((SECONDS - t0)) -lt 10 ]; then
      pass "stdin closed: the server answers, then exits at once (exit 5)"
    else fail "stdin closed: exit $rc"; cat "$work/out" "$work/err"; fi
    no_server_left && pass "no remote server left" || fail "remote servers left"
    # The idle server started at the beginning: gone after 30 s, said why.
    wait $idle_pid
    read -r rc took <"$work/idle.rc" || { rc=none; took=0; }
    if [ "$rc" = 5 ] && [ "$took" -ge 29 ] && [ "$took" -lt 45 ] && grep -q "no client connected.*within 30 s" "$work/idle.err"; then
      pass "no client: the server left after $took s (exit 5)"
    else fail "no client: exit $rc after $took s"; cat "$work/idle.err"; fi
    no_server_left --server && pass "no remote server left at the end" || fail "servers left at the end"
    ;;
  netns)
    command -v ip >/dev/null || { echo "skipped: no ip"; exit 77; }
    two_hosts_up "rkssha$$" "rksshb$$" 10.203.0
    start_sshd 10.203.0.2 2222 "rksshb$$" || { fail "sshd in the second namespace"; cat "$work/sshd.log"; exit 1; }
    rsh="ssh -p 2222 -i $work/ssh/client_key -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes -o LogLevel=ERROR"
    at=$tuser@10.203.0.2
    nscp() { in_a timeout --kill-after=5 30 "$bin" -e "$rsh" --rdmakit-path "$prog" --provider tcp "$@"; }
    nscp -r "$src/tree" "$at:." >"$work/out" && same_tree "$src/tree" "$home/tree" &&
      grep -qE "push to 10.203.0.2:[0-9]* \(tcp(, [0-9] lanes)?\)" "$work/out" &&
      pass "two hosts: push over tcp to the address ssh came in on" || { fail "two hosts: push"; cat "$work/out"; }
    others=$(find "$home/tree" ! -user "$tuser" | wc -l)
    [ "$others" = 0 ] && pass "two hosts: owned by $tuser" || fail "two hosts: $others entries not owned by $tuser"
    nscp -r "$at:tree" "$work/pulled" >"$work/out" && same_tree "$src/tree" "$work/pulled/tree" &&
      pass "two hosts: pull" || { fail "two hosts: pull"; cat "$work/out"; }
    no_server_left && pass "two hosts: no remote server left" || fail "two hosts: remote servers left"
    ;;
  *) echo "unknown mode $mode"; exit 2 ;;
esac
if grep -qE "Sanitizer|runtime error" "$work/err" "$work/idle.err" 2>/dev/null; then
  fail "sanitizer report"
fi
[ $fails = 0 ] || { echo "$fails failure(s)"; tail -5 "$work/sshd.log" 2>/dev/null; exit 1; }
echo "all passed"
