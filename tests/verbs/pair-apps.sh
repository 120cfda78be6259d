#!/usr/bin/env bash
# The applications across two hosts, one process per host: node0 (this
# script with NODE=0) serves, node1 is the client. Run by guest-tests.sh in
# the two Soft-RoCE VMs; any two hosts that share a directory will do.
#   pair-apps.sh mesh BUILD_DIR   rdmakit-mesh, 2 ranks (standalone bootstrap),
#                                 rank 0 on node0, rank 1 on node1
#   pair-apps.sh cp BUILD_DIR     rdmakit-cp: node1 pushes a small tree to
#                                 node0's server and pulls it back (also
#                                 over --lanes 2); every copy byte-identical
#                                 to the source
#   pair-apps.sh sync BUILD_DIR   rdmakit-cp's sync across the hosts against a
#                                 local rsync on node1: the same itemized
#                                 changes and the same tree, round by round
# Environment: SOFTROCE_NODE (0|1), SOFTROCE_IP (this host), SOFTROCE_PEER_IP,
# SOFTROCE_PAIR_DIR (a directory both hosts see), PAIR_PROVIDER (default verbs),
# PAIR_PORT (default 7990). Every wait is bounded.
set -u
mode=${1:?mode}
build=${2:?build dir}
node=${SOFTROCE_NODE:?}
self=${SOFTROCE_IP:?}
peer=${SOFTROCE_PEER_IP:?}
pair=${SOFTROCE_PAIR_DIR:?}
provider=${PAIR_PROVIDER:-verbs}
port=${PAIR_PORT:-7990}
work=$(mktemp -d "${TMPDIR:-/tmp}/pair-apps.XXXXXX")
server_pid=
trap '[ -z "$server_pid" ] || kill -9 "$server_pid" 2>/dev/null; chmod -R u+rwx "$work"; rm -rf "$work"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
pass() { echo "ok: $*"; }
# wait_for FILE SECONDS: the other node's signal (a file in the shared dir).
wait_for() {
  local i
  for ((i = 0; i < $2 * 10; i++)); do [ -e "$1" ] && return 0; sleep 0.1; done
  fail "the other node never wrote $(basename "$1")"
  return 1
}

# What a tree holds: names, kinds, modes, sizes, mtimes, link targets, and
# a hash of every regular file's bytes.
manifest() {
  (cd "$1" && find . -mindepth 1 -printf '%p %y %m %s %T@ %l\n' | LC_ALL=C sort &&
    find . -type f -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum)
}

# node0's rdmakit-cp daemon on this host's address (cp and sync modes).
start_cp_server() {
  mkdir -p "$work/root"
  "$bin" serve --root "$work/root" -p "$port" --bind "$self" --provider "$provider" \
    --port-file "$work/port" 2>"$work/server.log" &
  server_pid=$!
  for _ in $(seq 300); do [ -s "$work/port" ] && break; sleep 0.1; done
  [ -s "$work/port" ] || { fail "server did not start"; cat "$work/server.log"; exit 1; }
}

case $mode in
  mesh)
    bin=$build/apps/mesh/rdmakit-mesh
    if [ "$node" = 0 ]; then
      root="$self:$port"
    else
      root="$peer:$port"
    fi
    timeout --kill-after=5 60 "$bin" --rank "$node" --size 2 --root "$root" --host "$self" \
      -p "$provider" -t 1 --chunk 16384 --window 2 >"$work/out" 2>"$work/err"
    rc=$?
    [ $rc = 0 ] && pass "rank $node exit 0" || fail "rank $node exit $rc"
    if [ "$node" = 0 ]; then
      grep -q "rdmakit-mesh: 2 ranks (standalone bootstrap, $provider)" "$work/out" ||
        fail "no 2-rank $provider table"
      [ "$(grep -cE '^ +[01]:' "$work/out")" = 2 ] || fail "not 2 rows"
      ! grep -qE 'LOST|did not report' "$work/out" || fail "a rank was lost"
      grep -q "connection setup" "$work/out" || fail "no setup time"
    fi
    grep -v '^\[' "$work/out"
    [ $fails = 0 ] || { echo "--- stderr"; cat "$work/err"; }
    ;;
  cp)
    bin=$build/apps/cp/rdmakit-cp
    # Not loopback: the server needs a secret; both nodes share this one.
    export RDMAKIT_SECRET=rdmakit-verbs-pair-test-secret
    rm -f "$pair/cp."*.node"$node"
    if [ "$node" = 0 ]; then
      start_cp_server
      touch "$pair/cp.ready.node0"
      # What arrived, for node1 to compare with its source.
      if wait_for "$pair/cp.pushed.node1" 120; then
        manifest "$work/root/tree" >"$pair/cp.manifest.node0.tmp" &&
          mv "$pair/cp.manifest.node0.tmp" "$pair/cp.manifest.node0"
      fi
      wait_for "$pair/cp.done.node1" 120
      kill "$server_pid" 2>/dev/null
      wait "$server_pid"
      rc=$?
      server_pid=
      [ $rc = 0 ] && pass "server stopped cleanly" || { fail "server exit $rc"; cat "$work/server.log"; }
    else
      # A small tree of every entry kind; a file of several chunks, a hole.
      src=$work/src/tree
      mkdir -p "$src/sub/deeper" "$src/empty dir" "$work/pulled"
      : >"$src/empty"
      echo hello >"$src/small.txt"
      head -c 4095 /dev/urandom >"$src/sub/odd"
      head -c $((2 * 1024 * 1024 + 17)) /dev/urandom >"$src/sub/deeper/multi"
      truncate -s 1M "$src/sparse"
      head -c 5000 /dev/urandom | dd of="$src/sparse" bs=4096 seek=100 conv=notrunc status=none
      for i in 1 2 3 4 5; do head -c $((i * 97)) /dev/urandom >"$src/sub/f$i"; done
      echo "with space" >"$src/name with space"
      ln -s small.txt "$src/link"
      ln -s does/not/exist "$src/dangling"
      chmod 600 "$src/small.txt"
      chmod 755 "$src/sub/odd"
      mkdir "$src/ro" && echo ro >"$src/ro/file" && chmod 555 "$src/ro"
      touch -h -d '2001-02-03 04:05:06.123456789' "$src/link" "$src/empty"
      manifest "$src" >"$work/want"
      cp_() { timeout --kill-after=5 90 "$bin" -q --provider "$provider" -p "$port" "$@"; }
      if wait_for "$pair/cp.ready.node0" 60; then
        cp_ -r "$src" "$peer:." && pass "push -r exit 0" || fail "push -r exit $?"
        touch "$pair/cp.pushed.node1"
        if wait_for "$pair/cp.manifest.node0" 60; then
          diff "$work/want" "$pair/cp.manifest.node0" >"$work/diff" &&
            pass "push: the tree on node0 is identical" ||
            { fail "push: trees differ"; head -20 "$work/diff"; }
        fi
        cp_ -r "$peer:tree" "$work/pulled" && pass "pull -r exit 0" || fail "pull -r exit $?"
        manifest "$work/pulled/tree" >"$work/got"
        diff "$work/want" "$work/got" >"$work/diff" &&
          pass "pull: the tree back on node1 is identical" ||
          { fail "pull: trees differ"; head -20 "$work/diff"; }
        # Over two lanes (two connections, each with its own slots): pushed
        # to a new name and pulled back, identical to the source.
        out=$(cp_ --lanes 2 --json -r "$src" "$peer:lanes2") && echo "$out" | grep -q '"lanes": 2' &&
          pass "push --lanes 2: exit 0, 2 lanes" || fail "push --lanes 2: $out"
        cp_ --lanes 2 -r "$peer:lanes2" "$work/pulled-lanes2" &&
          pass "pull --lanes 2 exit 0" || fail "pull --lanes 2 exit $?"
        manifest "$work/pulled-lanes2" >"$work/got-lanes2"
        diff "$work/want" "$work/got-lanes2" >"$work/diff" &&
          pass "--lanes 2: pushed and pulled back, identical" ||
          { fail "--lanes 2: trees differ"; head -20 "$work/diff"; }
      fi
      touch "$pair/cp.done.node1"
    fi
    ;;
  sync)
    bin=$(realpath "$build/apps/cp/rdmakit-cp")
    export RDMAKIT_SECRET=rdmakit-verbs-pair-test-secret
    rm -f "$pair/sync."*.node"$node"
    rounds="first unchanged changes dry"
    if [ "$node" = 0 ]; then
      start_cp_server
      touch "$pair/sync.ready.node0"
      # After each round: what the destination holds, for node1 to compare.
      for r in $rounds; do
        wait_for "$pair/sync.$r.node1" 120 || break
        manifest "$work/root/src" >"$pair/sync.m-$r.node0.tmp" &&
          mv "$pair/sync.m-$r.node0.tmp" "$pair/sync.m-$r.node0"
      done
      kill "$server_pid" 2>/dev/null
      wait "$server_pid"
      server_pid=
    else
      cd "$work" || exit 1
      mkdir -p src/a/b r
      for i in $(seq 1 20); do echo "file $i" >"src/a/f$i"; done
      echo deep >src/a/b/d
      head -c $((3 * 1024 * 1024)) /dev/urandom >src/big
      ln -s a/f1 src/link
      chmod 600 src/a/f2
      ours() { timeout --kill-after=5 90 "$bin" --provider "$provider" -p "$port" -r -i "$@" src "$peer:."; }
      theirs() { rsync -rlpt --modify-window=-1 -i "$@" src r/; }
      round() {
        local r=$1
        shift
        ours "$@" >ours.out 2>ours.err || fail "$r: rdmakit-cp exit $?"
        theirs "$@" >rsync.out 2>&1 || fail "$r: rsync exit $?"
        touch "$pair/sync.$r.node1"
        sed 's/^</>/' ours.out | grep -v '^rdmakit-cp: ' | LC_ALL=C sort >ours.sorted
        LC_ALL=C sort rsync.out >rsync.sorted
        diff rsync.sorted ours.sorted >diff.out && pass "$r: the changes rsync lists" ||
          { fail "$r: itemized changes differ"; cat diff.out ours.err; }
        if wait_for "$pair/sync.m-$r.node0" 60; then
          manifest r/src >want
          diff want "$pair/sync.m-$r.node0" >diff.out && pass "$r: the tree rsync makes" ||
            { fail "$r: trees differ"; head -20 diff.out; }
        fi
      }
      if wait_for "$pair/sync.ready.node0" 60; then
        round first --delete
        round unchanged --delete
        echo more >>src/a/f3
        printf 'XXXX' | dd of=src/big bs=1 seek=1500000 conv=notrunc status=none
        rm src/a/f4 && echo new >src/a/new && chmod 640 src/a/f5 && ln -sfn a/f2 src/link
        round changes --delete
        echo dry >>src/a/f6
        round dry --delete -n
      fi
    fi
    ;;
  *) echo "usage: pair-apps.sh mesh|cp|sync BUILD_DIR" >&2; exit 2 ;;
esac
echo "pair-apps $mode (node$node): $([ $fails = 0 ] && echo PASS || echo "$fails failed")"
exit $((fails > 0))
