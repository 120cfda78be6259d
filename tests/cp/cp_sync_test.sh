#!/bin/bash
# rdmakit-cp's sync options against a local rsync: the same tree, the same
# options and the same changes, then the same itemized list (-i, with '<'
# read as '>') and the same resulting tree (rsync -n --checksum between the
# two destinations reports nothing).
#   cp_sync_test.sh RDMAKIT_CP PROVIDER [push|pull|kill|hostile][-netns]
# RDMAKIT_CP_TEST_LANES=N runs every copy with --lanes N.
# With -netns the server runs on a second host (a network namespace joined
# to the client's by a veth pair; root only, else exit 77).
set -u
cp_bin=$(realpath "$1")
provider=$2
mode=${3:-push}
two_hosts=false
if [ "${mode%-netns}" != "$mode" ]; then
  mode=${mode%-netns}
  two_hosts=true
  if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null; then
    echo "skipped: two hosts need root"
    exit 77
  fi
fi
work=$(mktemp -d /tmp/rdmakit-cp-sync.XXXXXX)
failures=0
server=
tag="rkcs$$"
cleanup() {
  [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null
  if $two_hosts; then
    ip netns del ${tag}a 2>/dev/null
    ip netns del ${tag}b 2>/dev/null
  fi
  rm -rf "$work"
}
trap cleanup EXIT
pass() { echo "PASS: $*"; }
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}
cd "$work" || exit 1
mkdir -p root/c r
host=127.0.0.1
on_server=()
on_client=()
auth=()
if $two_hosts; then
  ip netns add ${tag}a && ip netns add ${tag}b || exit 1
  ip link add ${tag}va netns ${tag}a type veth peer name ${tag}vb netns ${tag}b || exit 1
  ip -n ${tag}a addr add 10.202.0.1/24 dev ${tag}va
  ip -n ${tag}b addr add 10.202.0.2/24 dev ${tag}vb
  for ns in ${tag}a ${tag}b; do ip -n $ns link set lo up; done
  ip -n ${tag}a link set ${tag}va up
  ip -n ${tag}b link set ${tag}vb up
  host=10.202.0.1
  on_server=(ip netns exec ${tag}a)
  on_client=(ip netns exec ${tag}b)
  # Not loopback: the server needs a secret.
  head -c 32 /dev/urandom | base64 >key && chmod 600 key
  auth=(--secret-file "$work/key")
fi
"${on_server[@]}" "$cp_bin" serve --root "$work/root" --provider "$provider" -p 0 \
  --port-file port --bind "$host" "${auth[@]}" >server.log 2>&1 &
server=$!
for _ in $(seq 100); do [ -s port ] && break; sleep 0.05; done
port=$(cat port)
# RDMAKIT_CP_TEST_LANES=N: every copy over N lanes (--lanes N).
lanes=(${RDMAKIT_CP_TEST_LANES:+--lanes "$RDMAKIT_CP_TEST_LANES"})
ours() { "${on_client[@]}" timeout 120 "$cp_bin" --provider "$provider" -p "$port" "${auth[@]}" "${lanes[@]}" "$@"; }
# The same, replacing the calling (sub)shell: $! is then the copy itself.
ours_exec() { exec "${on_client[@]}" "$cp_bin" --provider "$provider" -p "$port" "${auth[@]}" "${lanes[@]}" "$@"; }

# A source tree with what a sync must tell apart: sizes around the 1 MiB
# block, nested and empty directories, symlinks, odd names, modes.
make_tree() {
  local t=$1
  mkdir -p "$t/a/b/c" "$t/empty" "$t/logs" "$t/build/obj" "$t/with space"
  for i in $(seq 1 40); do echo "file $i $RANDOM" >"$t/a/f$i.txt"; done
  for i in $(seq 1 10); do echo "deep $i" >"$t/a/b/c/d$i"; done
  head -c 3145728 /dev/urandom >"$t/big.bin"
  head -c 200000 /dev/urandom >"$t/mid.bin"
  : >"$t/zero"
  echo log >"$t/logs/x.log"
  echo obj >"$t/build/obj/o.o"
  echo "sp" >"$t/with space/s p.txt"
  ln -s a/f1.txt "$t/link"
  ln -s missing "$t/dangling"
  chmod 600 "$t/a/f2.txt"
  chmod 755 "$t/a/f3.txt"
}

# One round: rsync into r/, rdmakit-cp into the server's c/ (push) or from
# the server's copy into p/ (pull), both with OPTS. Their itemized lists and
# the resulting trees must match.
round() {
  local name=$1
  shift
  local extra_cmp=${CMP_OPTS:-}
  rsync -rlpt --modify-window=-1 -i "$@" src r/ >rsync.out 2>rsync.err
  local rc_r=$?
  if [ "$mode" = pull ]; then
    rm -rf root/src && cp -a src root/src
    ours -r -i "$@" "$host:src" p/ >ours.out 2>ours.err
  else
    ours -r -i "$@" src "$host:c" >ours.out 2>ours.err
  fi
  local rc_c=$?
  local dst=root/c
  [ "$mode" = pull ] && dst=p
  sort rsync.out >rsync.sorted
  sed 's/^</>/' ours.out | grep -v "^rdmakit-cp: " | sort >ours.sorted
  if [ $rc_r != 0 ] || [ $rc_c != 0 ]; then
    fail "$name: exit codes rsync $rc_r, rdmakit-cp $rc_c"
    cat ours.err rsync.err
    return
  fi
  if ! diff -u rsync.sorted ours.sorted >diff.out; then
    fail "$name: itemized changes differ from rsync's"
    cat diff.out
    return
  fi
  # shellcheck disable=SC2086
  rsync -rlpt -n -i --checksum --modify-window=-1 --delete $extra_cmp r/src/ "$dst/src/" \
    >tree.out 2>&1
  if [ -s tree.out ]; then
    fail "$name: trees differ"
    cat tree.out
    return
  fi
  pass "$name ($(wc -l <rsync.sorted) changes listed)"
}

case "$mode" in
  push | pull)
    mkdir -p p
    make_tree src
    round "first copy"
    round "nothing changed"
    # Appends, in-place edits, a touch, modes, removals, additions, a
    # retargeted symlink, type changes.
    echo more >>src/a/f5.txt
    printf 'XXXX' | dd of=src/big.bin bs=1 seek=1500000 conv=notrunc 2>/dev/null
    touch -d '2024-01-02 03:04:05.123456789' src/a/f6.txt
    chmod 640 src/a/f7.txt
    rm src/a/f8.txt
    rm -r src/a/b/c
    echo new >src/a/new.txt
    mkdir -p src/newdir/sub && echo n >src/newdir/sub/n
    ln -sfn a/f2.txt src/link
    rm src/zero && mkdir src/zero && echo z >src/zero/z
    rm -r src/empty && echo was-dir >src/empty
    round "changes with --delete" --delete
    # -n lists the same and changes nothing (the next round sees it all).
    echo dry >>src/a/f9.txt
    rm src/a/f10.txt
    round "dry run" -n --delete
    CMP_OPTS="" round "after the dry run" --delete
    # Excludes protect destination entries from --delete, as rsync's do.
    echo gone >>src/logs/x.log
    printf '%s\n' '# comment' '- *.o' '+ logs/' >rules
    round "excludes" --delete --exclude '*.log' --exclude 'build/' --exclude-from rules \
      --include 'a/***'
    round "--delete-excluded" --delete-excluded --exclude '*.txt'
    round "back to the full tree" --delete
    # Same size and mtime, other content: only --checksum sees it.
    cp -p src/a/f11.txt saved && printf 'Z' | dd of=src/a/f11.txt bs=1 seek=0 conv=notrunc \
      2>/dev/null && touch -r saved src/a/f11.txt
    round "quick check misses same size and mtime"
    round "--checksum" --checksum
    if [ "$(id -u)" = 0 ]; then
      # Ownership, ACLs, xattrs and hard links (as root).
      chown nobody:nogroup src/a/f12.txt
      chown daemon src/mid.bin
      setfacl -m u:nobody:r src/a/f13.txt
      setfacl -d -m u:nobody:rx src/newdir
      setfattr -n user.color -v blue src/a/f14.txt
      ln src/a/f15.txt src/a/hard15
      ln src/a/f15.txt src/newdir/hard15b
      CMP_OPTS="-HAXog" round "-o -g -A -X -H" -o -g -A -X -H --delete
      CMP_OPTS="-HAXog --numeric-ids" round "nothing changed (-HAXog)" -o -g -A -X -H
      setfattr -n user.color -v red src/a/f14.txt
      chown root src/mid.bin
      CMP_OPTS="-HAXog" round "attributes only" -o -g -A -X -H
    fi
    # Delta: 4 bytes changed in a 3 MiB file move one 1 MiB block; the
    # other two come from the destination's copy. --stats says so, and the
    # progress options print rsync's lines.
    printf 'QQQQ' | dd of=src/big.bin bs=1 seek=2500000 conv=notrunc 2>/dev/null
    if [ "$mode" = pull ]; then
      cp -a src/big.bin root/src/big.bin
      ours -r --stats --progress "$host:src" p/ >stats.out 2>&1
    else
      ours -r --stats --progress src "$host:c" >stats.out 2>&1
    fi
    if grep -q "^Literal data: 1,048,576 bytes" stats.out &&
      grep -q "^Matched data: 2,097,152 bytes" stats.out &&
      grep -q "^Number of regular files transferred: 1$" stats.out &&
      grep -q "^src/big.bin$" stats.out && grep -q "100%.*(xfr#1, to-chk=[0-9]*/" stats.out; then
      pass "delta: one block of 3 sent, --stats and --progress as rsync's"
    else
      fail "delta stats"
      cat stats.out
    fi
    echo more >>src/a/f1.txt
    [ "$mode" = pull ] && cp -a src/a/f1.txt root/src/a/f1.txt
    if [ "$mode" = pull ]; then
      ours -r --info=progress2 "$host:src" p/ >progress.out 2>&1
    else
      ours -r --info=progress2 src "$host:c" >progress.out 2>&1
    fi
    grep -q "100%.*(xfr#1, to-chk=0/" progress.out && pass "--info=progress2" ||
      fail "--info=progress2: $(cat progress.out)"
    if [ "$mode" = push ]; then
      # --partial-dir: a part file left in DIR beside the file is continued
      # (its first two blocks are right), and DIR goes once empty.
      rm root/c/src/big.bin
      mkdir -p root/c/src/.part
      head -c 2097152 src/big.bin >root/c/src/.part/big.bin
      ours -r --stats --partial-dir .part src "$host:c" >stats.out 2>&1
      if grep -q "^Matched data: 2,097,152 bytes" stats.out && [ ! -e root/c/src/.part ] &&
        cmp -s src/big.bin root/c/src/big.bin; then
        pass "--partial-dir: the part file's blocks kept, the directory gone"
      else
        fail "--partial-dir"
        cat stats.out
        ls -la root/c/src
      fi
      # --bwlimit paces the data: 3 MiB at 4 MiB/s take at least 0.6 s.
      head -c 3145728 /dev/urandom >src/paced.bin
      t0=$(date +%s%N)
      ours -r --bwlimit 4M -q src "$host:c" >/dev/null 2>&1
      ms=$((($(date +%s%N) - t0) / 1000000))
      if [ $ms -ge 600 ] && cmp -s src/paced.bin root/c/src/paced.bin; then
        pass "--bwlimit 4M: 3 MiB in $ms ms"
      else
        fail "--bwlimit 4M: 3 MiB in $ms ms"
      fi
    fi
    ;;
  hostile)
    # A hostile serving sender on a pull (test hooks of the server): it
    # names a top the client did not ask for, lists a file as a hard link to
    # a file of the client's that is not in the transfer, and names files
    # with terminal escape sequences. The client refuses the first two
    # (exit 4) and shows the names escaped.
    make_tree root/src
    mkdir -p victim && echo secret >victim/keep && chmod 600 victim/keep
    hostile_server() {
      env "$@" "${on_server[@]}" "$cp_bin" serve --root "$work/root" --provider "$provider" \
        -p 0 --port-file hport --bind "$host" "${auth[@]}" >hostile.log 2>&1 &
      hostile=$!
      for _ in $(seq 100); do [ -s hport ] && break; sleep 0.05; done
    }
    stop_hostile() {
      kill "$hostile" 2>/dev/null
      wait "$hostile" 2>/dev/null
      rm -f hport
    }
    hostile_server RDMAKIT_CP_TEST_TOP=evil
    "${on_client[@]}" timeout 60 "$cp_bin" --provider "$provider" -p "$(cat hport)" \
      "${auth[@]}" -r -q "$host:src" victim/ >out 2>err
    rc=$?
    stop_hostile
    if [ $rc = 4 ] && [ ! -e victim/evil ] && grep -q "not beneath a name that was asked for" err; then
      pass "pull: a server naming another top is refused (exit 4), nothing written"
    else
      fail "pull: another top: exit $rc, $(ls victim)"
      cat err
    fi
    hostile_server RDMAKIT_CP_TEST_LINK_TO=keep
    "${on_client[@]}" timeout 60 "$cp_bin" --provider "$provider" -p "$(cat hport)" \
      "${auth[@]}" -r -q "$host:src" victim/ >out 2>err
    rc=$?
    stop_hostile
    if [ $rc = 4 ] && [ "$(stat -c %h victim/keep)" = 1 ] &&
      [ "$(stat -c %a victim/keep)" = 600 ] && grep -q "not a file of this transfer" err; then
      pass "pull: a hard link to a file outside the transfer is refused (exit 4)"
    else
      fail "pull: hard link outside the transfer: exit $rc"
      cat err
    fi
    esc=$(printf 'esc\033[2Jname')
    echo x >"root/src/$esc"
    "${on_client[@]}" timeout 60 "$cp_bin" --provider "$provider" -p "$port" "${auth[@]}" \
      -r -i "$host:src" victim/ >out 2>&1
    if grep -qF 'esc\#033[2Jname' out && ! grep -q "$(printf '\033')" out; then
      pass "names with escape sequences are shown escaped"
    else
      fail "escape sequences reach the terminal"
      cat -A out | head
    fi
    ;;
  kill)
    # A delta run killed at a random moment, then run again: the result is
    # the source, whole.
    mkdir -p src
    for i in $(seq 1 4); do head -c $((8 * 1048576)) /dev/urandom >"src/big$i"; done
    for i in $(seq 1 200); do echo "small $i" >"src/s$i"; done
    ours -r -q src "$host:c" || fail "seed"
    runs=${RDMAKIT_CP_KILL_RUNS:-5}
    for run in $(seq 1 "$runs"); do
      for i in $(seq 1 4); do
        printf 'run%03d' "$run" |
          dd of="src/big$i" bs=1 seek=$(((RANDOM % 8) * 1048576 + run)) conv=notrunc 2>/dev/null
      done
      echo "run $run" >>"src/s$((run % 200 + 1))"
      ours_exec -r -q src "$host:c" >/dev/null 2>&1 &
      pid=$!
      sleep "0.0$((RANDOM % 10))"
      kill -9 "$pid" 2>/dev/null
      wait "$pid" 2>/dev/null
      if ours -r -q src "$host:c" >/dev/null &&
        diff -r src root/c/src >/dev/null; then
        pass "run $run: killed, then run again: identical"
      else
        fail "run $run: the rerun did not finish the job"
      fi
    done
    ;;
esac
# Sanitizer reports of the servers (clients fail their own exit code).
for log in server.log hostile.log; do
  if [ -f "$log" ] && grep -qE "Sanitizer|runtime error" "$log"; then
    grep -E -A20 "Sanitizer|runtime error" "$log" | head -40
    fail "sanitizer report in $log"
  fi
done
[ $failures = 0 ] && echo "all passed" && exit 0
echo "$failures failure(s)"
exit 1
