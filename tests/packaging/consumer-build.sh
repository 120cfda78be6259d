#!/usr/bin/env bash
# Builds and runs programs against an installed rdmakit: with CMake
# (find_package: rdmakit::rdmakit, rdmakit::session) and with pkg-config
# (rdmakit). Used by the package stage (in the chroot, prefix /usr) and by
# the packaging ctest (a non-default prefix).
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
"$work/cmake/consumer" | tee "$work/cmake.out"
grep -q "session thread mode workers" "$work/cmake.out"
# shellcheck disable=SC2046
g++ -DRDMAKIT_CONSUMER_CORE_ONLY -o "$work/pc-consumer" "$src/core.cpp" \
  $(pkg-config --cflags --libs rdmakit)
"$work/pc-consumer" | grep "consumer: provider"
echo "consumer-build: PASS (find_package and pkg-config)"
