#!/usr/bin/env bash
# `cmake --install BUILD --prefix P` at a non-default prefix gives a working
# installation: a consumer builds against P with find_package and
# pkg-config, P/bin/rdmakit-run preloads P's library, the man pages are there.
#   prefix-install.sh BUILD_DIR
set -euo pipefail
build=$1
here=$(cd "$(dirname "$0")" && pwd)
prefix=$(mktemp -d /tmp/rdmakit-prefix.XXXXXX)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" >"$prefix.install.log" 2>&1 ||
  { cat "$prefix.install.log"; rm -f "$prefix.install.log"; exit 1; }
rm -f "$prefix.install.log"
"$here/consumer-build.sh" "$prefix/work" "$prefix"
lib=$(find "$prefix" -name librdmakit-preload.so | head -1)
[ -n "$lib" ] || { echo "FAIL: no librdmakit-preload.so under $prefix"; exit 1; }
# Captured first: grep -q leaving early could end cat with SIGPIPE (pipefail).
maps=$("$prefix/bin/rdmakit-run" cat /proc/self/maps)
if ! grep -qF "$lib" <<<"$maps"; then
  echo "FAIL: $prefix/bin/rdmakit-run does not preload $lib"
  exit 1
fi
echo "rdmakit-run: preloads $lib"
for page in man1/rdmakit-cp.1.gz man1/rdmakit-run.1.gz man7/rdmakit-preload.7.gz; do
  [ -f "$prefix/share/man/$page" ] || { echo "FAIL: $page not installed"; exit 1; }
done
echo "prefix-install: PASS ($prefix)"
