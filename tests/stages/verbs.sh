#!/usr/bin/env bash
# CI stage: the verbs provider under Soft-RoCE in throw-away qemu VMs.
#   one VM (rxe loopback): rdmakit-info, rdmakit_verbs_test, the conformance
#     suite, and the rdmakit-perf cross-check on verbs (perf_crosscheck_verbs);
#   two VMs (two hosts): rdmakit_verbs_test and the conformance suite with
#     server and client roles on different VMs.
# tests/verbs/run-softroce-tests.sh installs qemu and the rest when missing
# (as root) and kills its VMs on failure, timeout or interruption. The VM part
# takes about 10 minutes on a 2-core machine; each VM run is capped.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${RDMAKIT_VERBS_BUILD:-build-test}
# Alone on a fresh machine: configure as the release stage does (optimized;
# emulation is slow enough).
config=()
[ -f "$build/CMakeCache.txt" ] ||
  config=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DRDMAKIT_BUILD_BENCH=OFF)
cmake -S . -B "$build" -G Ninja ${config[@]+"${config[@]}"} >/dev/null
ninja -C "$build" rdmakit_conformance rdmakit_verbs_test rdmakit-info rdmakit-perf \
  rdmakit_session_tests \
  >"$build.verbs-build.log" 2>&1 || { tail -30 "$build.verbs-build.log"; exit 1; }
start=$SECONDS
rc=0
tests/verbs/run-softroce-tests.sh --build-dir "$build" || rc=$?
echo "verbs stage: VM part $((SECONDS - start)) s"
exit $rc
