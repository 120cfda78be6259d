#!/usr/bin/env bash
# Quiet by default: at the default log level (RDMAKIT_LOG unset) a normal
# run and its teardown print nothing on stderr.
#   quiet_test.sh mesh16 PATH/TO/rdmakit-mesh
#       16 ranks on shm, standalone bootstrap: every rank's stderr empty, no
#       rank reported lost, the table complete.
#   quiet_test.sh kv PATH/TO/rdmakit-kv
#       a server (--quiet, with a secret) and clients doing puts and gets
#       (-q): no line of the library at all, the clients' stderr empty, the
#       server's only its own start and stop lines.
set -uo pipefail
mode=${1:?mode}
bin=${2:?binary}
unset RDMAKIT_LOG
dir=$(mktemp -d)
server_pid=
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
fail() {
  echo "FAIL [$mode]: $*"
  for f in "$dir"/err.*; do [ -s "$f" ] && { echo "--- $f"; head -n 20 "$f"; }; done
  exit 1
}

case $mode in
  mesh16)
    port=$((26000 + ($$ % 4000)))
    pids=()
    for ((r = 0; r < 16; r++)); do
      timeout 90 "$bin" --rank $r --size 16 --root 127.0.0.1:$port -p shm -t 0.5 \
        >"$dir/out.$r" 2>"$dir/err.$r" &
      pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || fail "a rank exited with $?"; done
    [ "$(grep -cE '^ +[0-9]+:' "$dir/out.0")" = 16 ] || fail "not 16 rows: $(cat "$dir/out.0")"
    ! grep -qE 'LOST|did not report' "$dir/out.0" || fail "a rank was lost"
    lines=$(cat "$dir"/err.* | wc -l)
    [ "$lines" = 0 ] || fail "$lines lines on stderr"
    echo "16 ranks, nothing on stderr"
    ;;
  kv)
    umask 077
    printf 'kv quiet test secret %s\n' "$RANDOM$RANDOM$RANDOM" >"$dir/kv.key"
    timeout -s KILL 60 "$bin" server -p 0 --quiet --secret-file "$dir/kv.key" \
      >"$dir/out.server" 2>"$dir/err.server" &
    server_pid=$!
    port=
    for _ in $(seq 100); do
      port=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9]*\) .*/\1/p' "$dir"/*.server)
      [ -n "$port" ] && break
      sleep 0.1
    done
    [ -n "$port" ] || fail "server did not start"
    i=0
    for cmd in "put alpha 1" "put beta 2" "get alpha" "getr beta" "del alpha"; do
      i=$((i + 1))
      # shellcheck disable=SC2086
      timeout 20 "$bin" client -q -p "$port" --secret-file "$dir/kv.key" $cmd \
        >>"$dir/out.client" 2>"$dir/err.client$i" || fail "client $cmd failed"
    done
    printf 'put gamma 3\nget gamma\ngetr gamma\n' |
      timeout 20 "$bin" client -q -p "$port" --secret-file "$dir/kv.key" - \
        >>"$dir/out.client" 2>"$dir/err.client$((i + 1))" || fail "client - failed"
    kill -INT "$server_pid"
    wait "$server_pid" || fail "server exited with $?"
    server_pid=
    grep -q "^value: 1$" "$dir/out.client" && grep -q "^value: 3$" "$dir/out.client" ||
      fail "values not read back: $(cat "$dir/out.client")"
    for f in "$dir"/err.client*; do
      [ -s "$f" ] && fail "a client wrote to stderr: $(cat "$f")"
    done
    ! grep -q '^\[rdmakit' "$dir/err.server" || fail "library lines on the server's stderr"
    # The server's own start and stop lines (its main), nothing else.
    others=$(grep -vcE '^rdmakit-kv server: (listening on|stopped after)' "$dir/err.server")
    [ "$others" = 0 ] || fail "$others other lines on the server's stderr"
    echo "kv: $i clients and a command stream, nothing on stderr but the server's start and stop"
    ;;
  *) echo "usage: quiet_test.sh mesh16|kv BINARY"; exit 2 ;;
esac
