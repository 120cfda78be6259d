#!/usr/bin/env bash
# Installs dependencies, builds rdmakit and runs the main job: the
# perftest-style benchmark in loopback on the default provider.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C build
if [ -x build/tools/rdmakit-perf/rdmakit-perf ]; then
  exec build/tools/rdmakit-perf/rdmakit-perf --loopback "$@"
fi
exec build/examples/hello_rdma
