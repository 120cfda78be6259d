#!/usr/bin/env bash
# rdmakit-mesh end to end:
#   shm8    8 ranks on shm, standalone bootstrap; table, JSON, CSV and PNG
#   kill    4 ranks on tcp, rank 2 SIGKILLs itself mid-run; the others report it
#   mpirun  4 ranks on tcp under mpirun --oversubscribe (PMIx bootstrap)
# Usage: mesh_test.sh MODE RDMAKIT_MESH_BINARY
set -u
mode=${1:?mode}
bin=${2:?binary}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
port=$((22000 + ($$ % 4000)))
fail() { echo "FAIL: $*"; for f in "$dir"/out.* "$dir"/err.*; do echo "--- $f"; grep -v '^\[' "$f"; done; exit 1; }

standalone() {  # standalone N PROVIDER ARGS...
  local n=$1 provider=$2; shift 2
  local pids=() r
  for ((r = 0; r < n; r++)); do
    timeout 60 "$bin" --rank $r --size "$n" --root 127.0.0.1:$port -p "$provider" -t 0.5 "$@" \
      >"$dir/out.$r" 2>"$dir/err.$r" &
    pids+=($!)
  done
  codes=()
  for p in "${pids[@]}"; do wait "$p"; codes+=($?); done
}

case $mode in
  shm8)
    standalone 8 shm -o "$dir/mesh"
    for c in "${codes[@]}"; do [ "$c" = 0 ] || fail "a rank exited with $c"; done
    grep -q "rdmakit-mesh: 8 ranks (standalone bootstrap, shm)" "$dir/out.0" || fail "no table"
    grep -q "connection setup" "$dir/out.0" || fail "no setup time"
    [ "$(grep -cE '^ +[0-7]:' "$dir/out.0")" = 8 ] || fail "not 8 rows"
    ! grep -qE 'LOST|did not report' "$dir/out.0" || fail "a rank was lost"
    [ "$(tail -n +2 "$dir/mesh.csv" | wc -l)" = 56 ] || fail "CSV has not 8x7 pairs"
    tail -n +2 "$dir/mesh.csv" | awk -F, '$3 <= 0 {bad = 1} END {exit bad}' || fail "a pair moved nothing"
    /usr/bin/python3 -c "import json,sys; d=json.load(open('$dir/mesh.json')); assert d['ranks']==8 and len(d['pairs'])==56" ||
      fail "bad JSON"
    [ -s "$dir/mesh.png" ] && head -c 8 "$dir/mesh.png" | grep -q PNG || fail "no heat-map PNG"
    grep "connection setup" "$dir/out.0"
    ;;
  kill)
    standalone 4 tcp --kill-rank 2 --kill-after 0.2
    [ "${codes[2]}" = 137 ] || fail "rank 2 was not killed (exit ${codes[2]})"
    for r in 0 1 3; do [ "${codes[$r]}" = 0 ] || fail "rank $r exited with ${codes[$r]}"; done
    grep -q "rank 2 did not report" "$dir/out.0" || fail "rank 0 did not report the dead rank"
    grep -q "1 rank(s) lost; the others finished" "$dir/out.0" || fail "no summary"
    for r in 0 1 3; do grep -q "lost rank 2" "$dir/err.$r" || fail "rank $r did not see rank 2 go"; done
    ;;
  mpirun)
    command -v mpirun >/dev/null || fail "mpirun missing (openmpi-bin, scripts/deps.sh)"
    timeout 90 mpirun --allow-run-as-root --oversubscribe -n 4 "$bin" -p tcp -t 0.5 \
      >"$dir/out.0" 2>"$dir/err.0" || fail "mpirun exited with $?"
    grep -q "rdmakit-mesh: 4 ranks (pmix bootstrap, tcp)" "$dir/out.0" || fail "not a PMIx run"
    [ "$(grep -cE '^ +[0-3]:' "$dir/out.0")" = 4 ] || fail "not 4 rows"
    ! grep -qE 'LOST|did not report' "$dir/out.0" || fail "a rank was lost"
    ;;
  *) echo "usage: mesh_test.sh shm8|kill|mpirun BINARY"; exit 2 ;;
esac
grep -v '^\[' "$dir/out.0"
echo "PASS: mesh $mode"
