#!/usr/bin/env bash
# Builds the Debian packages librdmakit0, librdmakit-dev and rdmakit-tools
# (CPack, cmake/packaging.cmake) into a directory (docs/packaging.md).
#   scripts/package.sh [OUT_DIR]        (default: build-pkg/debs)
#   RDMAKIT_PKG_BUILD=DIR               build directory (default: build-pkg)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build=${RDMAKIT_PKG_BUILD:-build-pkg}
out=${1:-$build/debs}
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
if command -v ccache >/dev/null; then
  export CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache
  export CCACHE_BASEDIR=$root CCACHE_NOHASHDIR=true
fi
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_INSTALL_PREFIX=/usr -DCMAKE_INSTALL_LIBDIR="lib/$multiarch" \
  -DRDMAKIT_BUILD_TESTS=OFF -DRDMAKIT_BUILD_BENCH=OFF -DRDMAKIT_BUILD_FUZZ=OFF \
  -DRDMAKIT_BUILD_TOOLS=ON -DRDMAKIT_BUILD_APPS=ON >/dev/null
ninja -C "$build" -j"${RDMAKIT_JOBS:-$(nproc)}" >"$build.package-build.log" 2>&1 ||
  { tail -30 "$build.package-build.log"; exit 1; }
rm -rf "$build/_CPack_Packages" "$build"/*.deb
(cd "$build" && cpack -G DEB >"$PWD.cpack.log" 2>&1) ||
  { tail -30 "$build.cpack.log"; exit 1; }
mkdir -p "$out"
rm -f "$out"/librdmakit0_*.deb "$out"/librdmakit-dev_*.deb "$out"/rdmakit-tools_*.deb
mv "$build"/*.deb "$out"/
ls -1 "$out"/*.deb
