#!/usr/bin/env bash
# End-to-end tests of rdmakit-cp (a server and clients as separate processes).
#   cp_test.sh BINARY tree PROVIDER     every entry kind, push and pull, byte-identical
#   cp_test.sh BINARY escape PROVIDER   '..', absolute paths, escaping symlinks refused
#   cp_test.sh BINARY fault PROVIDER    a chunk corrupted in flight is detected and re-sent
#   cp_test.sh BINARY kill PROVIDER     SIGKILL of either side at random points (20 runs):
#                                       no wrong file under a final name; --resume completes
#   cp_test.sh BINARY many PROVIDER     8 clients at once (4 push, 4 pull, different trees),
#                                       each byte-identical; a 9th refused by --max-clients 8
#   cp_test.sh BINARY netns             two hosts (network namespaces, tcp); root only
# RDMAKIT_CP_TEST_HOST: the server's address (default 127.0.0.1; the rxe IP on verbs).
# RDMAKIT_CP_KILL_RUNS: number of kill runs (default 20).
# RDMAKIT_CP_TEST_LANES=N: every copy with --lanes N, and the trees gain 500
# small files (a stream of many slots striped over the lanes).
set -u
bin=${1:?binary}
mode=${2:?mode}
provider=${3:-tcp}
host=${RDMAKIT_CP_TEST_HOST:-127.0.0.1}
# tmpfs when there is one: the disk must not dominate, and holes are kept there.
base=/dev/shm
[ -d "$base" ] && [ -w "$base" ] || base=${TMPDIR:-/tmp}
work=$(mktemp -d "$base/rdmakit-cp-test.XXXXXX")
server_pid=
start_server_args=()
cleanup() {
  [ -n "$server_pid" ] && kill -9 "$server_pid" 2>/dev/null
  wait 2>/dev/null
  chmod -R u+rwx "$work" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
# A server on an address other hosts reach needs a secret (docs/security.md):
# on such a host address (the rxe IP on verbs) both ends share one.
case $host in
  127.* | ::1 | localhost) ;;
  *) (umask 077; head -c 32 /dev/urandom | base64 >"$work/cp.key")
     export RDMAKIT_SECRET_FILE=$work/cp.key ;;
esac
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
pass() { echo "ok: $*"; }
lanes=(${RDMAKIT_CP_TEST_LANES:+--lanes "$RDMAKIT_CP_TEST_LANES"})
cp_() { timeout --kill-after=5 60 "$bin" -q --provider "$provider" -p "$port" "${lanes[@]}" "$@"; }

start_server() {  # start_server ROOT [ENV...]
  local root=$1; shift
  rm -f "$work/port"
  env "$@" "$bin" serve --root "$root" -p 0 --port-file "$work/port" --provider "$provider" \
    --bind "$host" "${start_server_args[@]}" 2>>"$work/server.log" &
  server_pid=$!
  for _ in $(seq 100); do [ -s "$work/port" ] && break; sleep 0.05; done
  port=$(cat "$work/port" 2>/dev/null) || { fail "server did not start"; tail "$work/server.log"; exit 1; }
}
stop_server() {  # SIGTERM: the server finishes cleanly with exit 0
  kill "$server_pid" 2>/dev/null
  wait "$server_pid"
  local rc=$?
  server_pid=
  [ $rc = 0 ] && pass "server stopped cleanly" || fail "server exit $rc on SIGTERM"
}

# Every kind of entry: empty, small, block-sized and multi-block files, a
# sparse file (leading hole, data, trailing hole), symlinks (relative,
# dangling, absolute target), odd modes, old mtimes, nested and empty dirs.
make_tree() {
  local t=$1
  mkdir -p "$t/sub/deeper" "$t/empty dir" "$t/ro"
  : >"$t/empty"
  echo hello >"$t/small.txt"
  head -c 4095 /dev/urandom >"$t/sub/odd"
  head -c $((1024 * 1024)) /dev/urandom >"$t/sub/one-block"
  head -c $((3 * 1024 * 1024 + 17)) /dev/urandom >"$t/sub/deeper/multi"
  truncate -s 6M "$t/sparse"
  head -c 100000 /dev/urandom | dd of="$t/sparse" bs=4096 seek=600 conv=notrunc status=none
  for i in $(seq 1 40); do head -c $((i * 97)) /dev/urandom >"$t/sub/f$i"; done
  echo "with space" >"$t/name with space"
  ln -s small.txt "$t/link"
  ln -s does/not/exist "$t/dangling"
  ln -s /etc/hostname "$t/abs-link"
  chmod 600 "$t/small.txt"; chmod 755 "$t/sub/odd"; chmod 444 "$t/sub/f1"
  echo ro >"$t/ro/file"; chmod 555 "$t/ro"
  touch -h -d '2001-02-03 04:05:06.123456789' "$t/link" "$t/sub/f2" "$t/empty"
  touch -d '1999-12-31 23:59:59' "$t/sub/deeper" "$t/empty dir"
  if [ ${#lanes[@]} -gt 0 ]; then
    mkdir -p "$t/many"
    for i in $(seq 1 500); do echo "small $i" >"$t/many/s$i"; done
    head -c $((5 * 1024 * 1024 + 3)) /dev/urandom >"$t/five-mib"
  fi
}

# Same names, kinds, modes, sizes, mtimes (ns), link targets and bytes.
same_tree() {  # same_tree A B
  local a b
  a=$(cd "$1" && find . -mindepth 1 -printf '%p %y %m %s %T@ %l\n' | LC_ALL=C sort)
  b=$(cd "$2" && find . -mindepth 1 -printf '%p %y %m %s %T@ %l\n' | LC_ALL=C sort)
  if [ "$a" != "$b" ]; then
    diff <(echo "$a") <(echo "$b") | head -10
    return 1
  fi
  diff -r --no-dereference "$1" "$2" >/dev/null
}

sparse_kept() {  # the copy allocates no more than the source (+ a block)
  local s d
  s=$(stat -c %b "$1"); d=$(stat -c %b "$2")
  [ "$d" -le $((s + 16)) ]
}

case $mode in
  tree)
    src=$work/src/tree; mkdir -p "$work/src" "$work/root" "$work/pulled"
    make_tree "$src"
    start_server "$work/root"
    # A part file left by an earlier run, with other permissions: replaced,
    # and the final file gets the source's mode all the same.
    mkdir -p "$work/root/tree"
    echo stale >"$work/root/tree/.small.txt.rdmakit-cp-part"
    chmod 666 "$work/root/tree/.small.txt.rdmakit-cp-part"
    cp_ -r "$src" "$host:." && pass "push -r exit 0" || fail "push -r exit $?"
    same_tree "$src" "$work/root/tree" && pass "push: tree identical" || fail "push: trees differ"
    sparse_kept "$src/sparse" "$work/root/tree/sparse" && pass "push: holes kept" ||
      fail "push: sparse file filled"
    cp_ -r "$host:tree" "$work/pulled" && pass "pull -r exit 0" || fail "pull -r exit $?"
    same_tree "$src" "$work/pulled/tree" && pass "pull: tree identical" || fail "pull: trees differ"
    sparse_kept "$src/sparse" "$work/pulled/tree/sparse" && pass "pull: holes kept" ||
      fail "pull: sparse file filled"
    # A single file to a new name, several files into a directory, overwrite.
    cp_ "$src/sub/odd" "$host:renamed" && cmp -s "$src/sub/odd" "$work/root/renamed" &&
      pass "push file to a new name" || fail "push file to a new name"
    mkdir "$work/root/many"
    cp_ "$src/small.txt" "$src/sub/one-block" "$host:many" &&
      cmp -s "$src/sub/one-block" "$work/root/many/one-block" && pass "push several files" ||
      fail "push several files"
    echo stale >"$work/root/renamed"
    cp_ "$src/sub/odd" "$host:renamed" && cmp -s "$src/sub/odd" "$work/root/renamed" &&
      pass "overwrite" || fail "overwrite"
    cp_ "$src/small.txt" "$src/sub/odd" "$host:nodir"
    [ $? = 2 ] && pass "several sources to a non-directory: exit 2" || fail "several sources to a non-directory"
    cp_ "$src/missing" "$host:." 2>/dev/null
    rc=$?; [ $rc = 2 ] && pass "missing source: exit 2" || fail "missing source: exit $rc"
    cp_ "$src" "$host:." 2>"$work/err"
    [ $? = 2 ] && grep -q "is a directory (use -r)" "$work/err" && pass "directory without -r" ||
      fail "directory without -r"
    # --resume over a complete copy sends no data.
    out=$(cp_ -r --resume --json "$src" "$host:.")
    echo "$out" | grep -q '"bytes_sent": 0' && pass "resume of a complete copy sends nothing" ||
      fail "resume of a complete copy: $out"
    same_tree "$src" "$work/root/tree" || fail "tree differs after resume"
    # --resume over a part file whose first two 1 MiB blocks are right and
    # whose third is wrong sends only the last two blocks (1 MiB + 17 bytes).
    head -c $((2 * 1024 * 1024)) "$src/sub/deeper/multi" >"$work/root/.partial.rdmakit-cp-part"
    head -c 4096 /dev/urandom >>"$work/root/.partial.rdmakit-cp-part"
    out=$(cp_ --resume --json "$src/sub/deeper/multi" "$host:partial")
    if echo "$out" | grep -q '"bytes_sent": 1048593' && cmp -s "$src/sub/deeper/multi" "$work/root/partial" &&
       [ ! -e "$work/root/.partial.rdmakit-cp-part" ]; then
      pass "resume of a part file sends only the blocks that do not verify"
    else fail "resume of a part file: $out"; fi
    # Unknown server: exit 5 with the address named.
    timeout 30 "$bin" -q --provider "$provider" -p 1 "$src/small.txt" "$host:x" 2>"$work/err"
    [ $? = 5 ] && pass "no server: exit 5" || fail "no server: exit code"
    stop_server
    # Every client said goodbye when it left (the server saw PEER_CLOSED,
    # not a connection cut by the client's exit).
    ended=$(grep -c "done:.*connection ended:" "$work/server.log")
    if [ "$ended" -ge 8 ] && ! grep "done:.*connection ended:" "$work/server.log" | grep -qv PEER_CLOSED; then
      pass "$ended clients closed with a goodbye"
    else fail "a client left without a goodbye"; grep "done:" "$work/server.log"; fi
    # No space: a 1 MiB tmpfs as the root; the error names the file and the
    # reason, exit 2, and nothing appears under the final name.
    if [ "$(id -u)" = 0 ] && mkdir "$work/tiny" && mount -t tmpfs -o size=1m tiny "$work/tiny" 2>/dev/null; then
      start_server "$work/tiny"
      cp_ "$src/sub/deeper/multi" "$host:multi" 2>"$work/err"
      rc=$?
      if [ $rc = 2 ] && grep -q "multi.*no space left on device" "$work/err" && [ ! -e "$work/tiny/multi" ]; then
        pass "no space: exit 2, named, no final file"
      else fail "no space: exit $rc"; cat "$work/err"; fi
      stop_server
      umount "$work/tiny"
    fi
    ;;
  escape | escape-fallback)
    # escape-fallback: the confinement without openat2 (kernels before 5.6),
    # which refuses symlinked directories altogether.
    [ $mode = escape-fallback ] && export RDMAKIT_CP_NO_OPENAT2=1
    mkdir -p "$work/root/inside" "$work/outside" "$work/pulled"
    echo secret >"$work/outside/secret"
    echo data >"$work/file"
    ln -s "$work/outside" "$work/root/escape"
    ln -s ../outside "$work/root/escape-rel"
    ln -s inside "$work/root/fine"
    start_server "$work/root"
    for dst in ../x ../../tmp/x /etc/x escape/x escape-rel/x inside/../../x; do
      cp_ "$work/file" "$host:$dst" 2>"$work/err"
      rc=$?
      if [ $rc = 4 ] && [ ! -e "$work/outside/x" ] && grep -q refused "$work/err"; then
        pass "push to $dst refused (exit 4)"
      else
        fail "push to $dst: exit $rc"; cat "$work/err"
      fi
    done
    for s in ../outside/secret escape/secret escape-rel/secret /etc/hostname; do
      cp_ "$host:$s" "$work/pulled/got" 2>"$work/err"
      rc=$?
      if [ $rc = 4 ] && [ ! -e "$work/pulled/got" ]; then pass "pull of $s refused (exit 4)"
      else fail "pull of $s: exit $rc"; cat "$work/err"; fi
    done
    if [ $mode = escape ]; then
      cp_ "$work/file" "$host:fine/ok" && [ -f "$work/root/inside/ok" ] &&
        pass "a symlink staying inside the root is followed" || fail "symlink inside the root"
    else
      cp_ "$work/file" "$host:fine/ok" 2>/dev/null
      [ $? = 4 ] && [ ! -e "$work/root/inside/ok" ] && grep -q "openat2 disabled" "$work/server.log" &&
        pass "fallback: symlinked directory refused, method logged" || fail "fallback confinement"
      cp_ "$work/file" "$host:inside/ok2" && [ -f "$work/root/inside/ok2" ] &&
        pass "fallback: plain subdirectory works" || fail "fallback: plain subdirectory"
    fi
    [ "$(ls "$work/outside")" = secret ] && pass "nothing written outside" || fail "outside changed"
    ;;
  fault)
    src=$work/src/tree; mkdir -p "$work/src" "$work/root" "$work/pulled"
    make_tree "$src"
    start_server "$work/root" RDMAKIT_CP_CORRUPT_CHUNK=2
    out=$(RDMAKIT_CP_CORRUPT_CHUNK=1 cp_ -r --json "$src" "$host:." 2>"$work/err")
    rc=$?
    # Chunk 1 carries file data: its block digest must catch the damage.
    if [ $rc = 0 ] && echo "$out" | grep -q '"chunks_resent": [1-9]' &&
       grep -q "file data failed verification.*asking again" "$work/server.log"; then
      pass "push: corrupted file data detected and re-sent"
    else fail "push with corrupted file data: exit $rc $out"; fi
    same_tree "$src" "$work/root/tree" && pass "push: tree identical" || fail "push: trees differ"
    # A damaged record byte (here the first record of chunk 0): the slot hash.
    mkdir -p "$work/root/again"
    out=$(RDMAKIT_CP_CORRUPT_CHUNK=0r cp_ -r --json "$src" "$host:again" 2>"$work/err")
    rc=$?
    if [ $rc = 0 ] && echo "$out" | grep -q '"chunks_resent": [1-9]' &&
       grep -q "records failed verification.*asking again" "$work/server.log"; then
      pass "push: corrupted record detected and re-sent"
    else fail "push with a corrupted record: exit $rc $out"; fi
    same_tree "$src" "$work/root/again/tree" && pass "push: tree identical after a bad record" ||
      fail "push: trees differ after a bad record"
    out=$(cp_ -r --json "$host:tree" "$work/pulled" 2>"$work/err")
    rc=$?
    if [ $rc = 0 ] && echo "$out" | grep -q '"chunks_resent": [1-9]' &&
       grep -q "failed verification" "$work/err"; then
      pass "pull: corrupted chunk detected and re-sent"
    else fail "pull with a corrupted chunk: exit $rc $out"; fi
    same_tree "$src" "$work/pulled/tree" && pass "pull: tree identical" || fail "pull: trees differ"
    # A client of an earlier protocol (1: one hash over the whole slot) is
    # refused before anything is copied, both versions named.
    RDMAKIT_CP_HELLO_VERSION=1 cp_ -r "$src" "$host:v1" 2>"$work/err"
    rc=$?
    if [ $rc = 5 ] && [ ! -e "$work/root/v1" ] &&
       grep -q "protocol version mismatch: the client speaks version 1, this server 4" "$work/err" &&
       grep -q "protocol version mismatch" "$work/server.log"; then
      pass "a protocol 1 client is refused, versions named (exit 5)"
    else fail "protocol 1 client: exit $rc"; cat "$work/err"; fi
    ;;
  kill)
    runs=${RDMAKIT_CP_KILL_RUNS:-20}
    src=$work/src/tree; mkdir -p "$work/src" "$work/root" "$work/local"
    make_tree "$src"
    head -c $((16 * 1024 * 1024)) /dev/urandom >"$src/sub/bigger"
    # Final names hold the source's bytes or nothing (part files are hidden names).
    check_no_wrong() {  # DEST_TREE
      local bad=0 f rel
      while IFS= read -r -d '' f; do
        rel=${f#"$1"/}
        case $(basename "$rel") in .*.rdmakit-cp-part) continue ;; esac
        if ! cmp -s "$f" "$src/$rel"; then echo "wrong content under a final name: $rel"; bad=1; fi
      done < <(find "$1" -type f -print0 2>/dev/null)
      # Symlinks are created under a part name and renamed too.
      while IFS= read -r -d '' f; do
        rel=${f#"$1"/}
        case $(basename "$rel") in .*.rdmakit-cp-part) continue ;; esac
        if [ "$(readlink "$f")" != "$(readlink "$src/$rel")" ]; then echo "wrong link under a final name: $rel"; bad=1; fi
      done < <(find "$1" -type l -print0 2>/dev/null)
      return $bad
    }
    part_with_data() {  # DEST_TREE: some part file there has allocated blocks
      find "$1" -name '.*.rdmakit-cp-part' -type f -printf '%b\n' 2>/dev/null | grep -qv '^0$'
    }
    start_server "$work/root"
    midway=0
    for i in $(seq 1 "$runs"); do
      chmod -R u+rwx "$work/root" "$work/local" 2>/dev/null
      rm -rf "$work/root/tree" "$work/local/tree"
      dir=$([ $((i % 2)) = 0 ] && echo push || echo pull)
      # Every four runs cover push and pull with either side killed; the
      # moment of the kill is random.
      victim=$([ $(((i / 2) % 2)) = 0 ] && echo client || echo server)
      if [ $dir = pull ]; then cp -a "$src" "$work/root/tree"; dest=$work/local/tree
      else dest=$work/root/tree; fi
      if [ $dir = push ]; then
        "$bin" -q --provider "$provider" -p "$port" "${lanes[@]}" -r "$src" "$host:." 2>/dev/null &
      else
        "$bin" -q --provider "$provider" -p "$port" "${lanes[@]}" -r "$host:tree" "$work/local" 2>/dev/null &
      fi
      client=$!
      if [ $dir = pull ]; then check_tree=$work/local/tree; else check_tree=$work/root/tree; fi
      if [ $(((i / 4) % 2)) = 1 ]; then
        # Four runs in eight (every direction and victim) wait until data
        # arrives, then kill a random 0-9 ms later; the others kill at a
        # random moment 5-205 ms after the start (setup, walk, copy or after).
        for _ in $(seq 1500); do part_with_data "$check_tree" && break; sleep 0.002; done
        sleep "0.00$((RANDOM % 10))"
      else
        sleep "0.$(printf '%03d' $((RANDOM % 200 + 5)))"
      fi
      # Mid-copy: the client still runs and a part file already holds data
      # (allocated blocks), so bytes had moved and the file was not finished.
      kill -0 $client 2>/dev/null && part_with_data "$check_tree" && midway=$((midway + 1))
      if [ $victim = client ]; then kill -9 $client 2>/dev/null
      else kill -9 "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null; server_pid=; fi
      timeout 30 tail --pid=$client -f /dev/null; wait $client 2>/dev/null
      check_no_wrong "$check_tree" || fail "run $i ($dir, killed $victim): wrong file"
      [ -z "$server_pid" ] && start_server "$work/root"
      if [ $dir = push ]; then cp_ -r --resume "$src" "$host:." >/dev/null 2>"$work/err"
      else cp_ -r --resume "$host:tree" "$work/local" >/dev/null 2>"$work/err"; fi
      rc=$?
      if [ $rc = 0 ] && same_tree "$src" "$dest"; then pass "run $i: $dir, $victim killed, resumed"
      else fail "run $i: $dir, $victim killed: resume exit $rc"; cat "$work/err"; fi
    done
    echo "$midway of $runs kills landed mid-copy (a part file with data existed)"
    [ "$midway" -ge 1 ] || fail "no kill landed mid-copy (no part file with data before any kill)"
    ;;
  many)
    # The server holds each admitted transfer while $hold exists (a test
    # hook), so all 8 are admitted at once before any copies: more than the
    # 4 lanes of the old shared buffer, and exactly --max-clients.
    n=8; hold=$work/hold
    mkdir -p "$work/src" "$work/root" "$work/pulled"
    for k in $(seq 1 $n); do  # (make_tree uses $i)
      make_tree "$work/src/t$k"
      [ $((k % 2)) = 0 ] && cp -a "$work/src/t$k" "$work/root/t$k"  # to be pulled
    done
    touch "$hold"
    start_server_args=(--max-clients $n)
    start_server "$work/root" RDMAKIT_CP_HOLD_FILE="$hold"
    pids=()
    for i in $(seq 1 $n); do
      if [ $((i % 2)) = 0 ]; then cp_ -r "$host:t$i" "$work/pulled" >/dev/null 2>"$work/err$i" &
      else cp_ -r "$work/src/t$i" "$host:." >/dev/null 2>"$work/err$i" & fi
      pids+=($!)
    done
    for _ in $(seq 150); do grep -q "($n copying)" "$work/server.log" && break; sleep 0.05; done
    grep -q "($n copying)" "$work/server.log" && pass "$n clients admitted at once" ||
      fail "$n clients were not admitted at once"
    cp_ "$work/src/t1/small.txt" "$host:extra" 2>"$work/err"
    rc=$?
    if [ $rc = 5 ] && grep -q "server busy.*--max-clients $n" "$work/err" && [ ! -e "$work/root/extra" ]; then
      pass "client $((n + 1)) refused: exit 5, the limit named"
    else fail "client $((n + 1)) beyond --max-clients: exit $rc"; cat "$work/err"; fi
    rm -f "$hold"
    for i in $(seq 1 $n); do
      wait "${pids[$((i - 1))]}"; rc=$?
      if [ $((i % 2)) = 0 ]; then dir=pull; dst=$work/pulled/t$i; else dir=push; dst=$work/root/t$i; fi
      if [ $rc = 0 ] && same_tree "$work/src/t$i" "$dst"; then pass "client $i ($dir): tree identical"
      else fail "client $i ($dir): exit $rc"; cat "$work/err$i"; fi
    done
    # The places are free again once the clients are gone.
    cp_ "$work/src/t1/small.txt" "$host:extra" >/dev/null && cmp -s "$work/src/t1/small.txt" "$work/root/extra" &&
      pass "a client after them is admitted" || fail "a client after them"
    stop_server
    ;;
  netns)
    if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null; then echo "skipped: needs root"; exit 77; fi
    tag="rkcp$$"; a=${tag}a; b=${tag}b
    ip netns add $a && ip netns add $b || exit 77
    trap 'ip netns del $a 2>/dev/null; ip netns del $b 2>/dev/null; cleanup' EXIT
    ip link add ${tag}va netns $a type veth peer name ${tag}vb netns $b || exit 1
    ip -n $a addr add 10.201.0.1/24 dev ${tag}va; ip -n $b addr add 10.201.0.2/24 dev ${tag}vb
    for ns in $a $b; do ip -n $ns link set lo up; done
    ip -n $a link set ${tag}va up; ip -n $b link set ${tag}vb up
    src=$work/src/tree; mkdir -p "$work/src" "$work/root" "$work/pulled"
    make_tree "$src"
    # Not loopback: the server needs a secret (or --no-auth).
    head -c 32 /dev/urandom | base64 >"$work/key"; chmod 600 "$work/key"
    ip netns exec $a "$bin" serve --root "$work/root" -p 0 --port-file "$work/port" \
      --provider tcp --bind 10.201.0.1 --secret-file "$work/key" 2>>"$work/server.log" &
    server_pid=$!
    for _ in $(seq 100); do [ -s "$work/port" ] && break; sleep 0.05; done
    port=$(cat "$work/port")
    nscp() { ip netns exec $b timeout 60 "$bin" -q --provider tcp -p "$port" --secret-file "$work/key" "${lanes[@]}" "$@"; }
    ip netns exec $b timeout 60 "$bin" -q --provider tcp -p "$port" "$work/src" 10.201.0.1:x 2>"$work/err"
    [ $? = 4 ] && grep -q "requires a secret" "$work/err" && pass "two hosts: a client without the secret is refused" ||
      fail "two hosts: a client without the secret"
    nscp -r "$src" 10.201.0.1:. && same_tree "$src" "$work/root/tree" &&
      pass "two hosts: push" || fail "two hosts: push"
    nscp -r 10.201.0.1:tree "$work/pulled" && same_tree "$src" "$work/pulled/tree" &&
      pass "two hosts: pull" || fail "two hosts: pull"
    ;;
  *) echo "unknown mode $mode"; exit 2 ;;
esac
# Sanitizer reports of the server side (clients' fail their own exit code).
if grep -qE "Sanitizer|runtime error" "$work/server.log" 2>/dev/null; then
  grep -E -A20 "Sanitizer|runtime error" "$work/server.log" | head -60
  fail "sanitizer report in the server log"
fi
[ $fails = 0 ] || { echo "$fails failure(s)"; tail -20 "$work/server.log"; exit 1; }
echo "all passed"
