#!/usr/bin/env bash
# Builds and runs programs against an installed rdmakit: with CMake
# (find_package: rdmakit::rdmakit, rdmakit::session, rdmakit::stream) and
# with pkg-config (rdmakit alone; rdmakit-session and rdmakit-stream). Each
# program opens a context; the full ones echo a session message and stream
# bytes over shm. Used by the package stage (in the chroot, prefix /usr) and
# by the packaging ctest (a non-default prefix).
#   consumer-build.sh WORK_DIR [PREFIX]
set -euo pipefail
work=$1 prefix=${2:-}
src=$(cd "$(dirname "$0")/consumer" && pwd)
rm -rf "$work" && mkdir -p "$work"
cmake_args=()
if [ -n "$prefix" ]; then
  cmake_args+=(-DCMAKE_PREFIX_PATH="$prefix")
  PKG_CONFIG_PATH=$(find "$prefix" -type d -name pkgconfig -path '*/lib*' | paste -sd:)
  export PKG_CONFIG_PATH
  LD_LIBRARY_PATH=$(dirname "$(find "$prefix" -name 'librdmakit.so.0' | head -1)")
  export LD_LIBRARY_PATH
fi
export RDMAKIT_PROVIDER=${RDMAKIT_PROVIDER:-shm} RDMAKIT_LOG=warn
cmake -S "$src" -B "$work/cmake" ${cmake_args[@]+"${cmake_args[@]}"} >"$work/cmake.log" 2>&1 ||
  { cat "$work/cmake.log"; exit 1; }
cmake --build "$work/cmake" >>"$work/cmake.log" 2>&1 || { cat "$work/cmake.log"; exit 1; }
check() {  # what ran, its output
  grep -q "consumer: provider" <<<"$2" && grep -q "consumer: session (workers) echo hello" <<<"$2" &&
    grep -q "consumer: stream echo stream bytes" <<<"$2" || { echo "FAIL: $1"; exit 1; }
}
out=$("$work/cmake/consumer") || { echo "$out"; echo "FAIL: find_package consumer"; exit 1; }
echo "$out"
check "find_package consumer" "$out"
# shellcheck disable=SC2046
g++ -DRDMAKIT_CONSUMER_CORE_ONLY -o "$work/pc-core" "$src/core.cpp" \
  $(pkg-config --cflags --libs rdmakit)
"$work/pc-core" | grep "consumer: provider"
# shellcheck disable=SC2046
g++ -o "$work/pc-consumer" "$src/core.cpp" "$src/session.cpp" "$src/stream.cpp" \
  $(pkg-config --cflags --libs rdmakit-session rdmakit-stream)
out=$("$work/pc-consumer") || { echo "$out"; echo "FAIL: pkg-config consumer"; exit 1; }
echo "$out"
check "pkg-config consumer" "$out"
for bin in "$work/cmake/consumer" "$work/pc-consumer"; do
  for so in librdmakit.so.0 librdmakit-session.so.0 librdmakit-stream.so.0; do
    readelf -d "$bin" | grep -qF "[$so]" || { echo "FAIL: $bin does not link $so"; exit 1; }
  done
done
echo "consumer-build: PASS (find_package and pkg-config; core, session, stream)"
