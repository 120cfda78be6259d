#!/usr/bin/env bash
# CI stage: the verbs provider under Soft-RoCE in throw-away qemu VMs.
#   one VM (rxe loopback): rdmakit-info, rdmakit_verbs_test, the conformance
#     suite, and the rdmakit-perf cross-check on verbs (perf_crosscheck_verbs);
#   two VMs (two hosts): rdmakit_verbs_test, the conformance, stream and
#     session suites with server and client roles on different VMs, then
#     rdmakit-mesh (2 ranks) and rdmakit-cp push/pull across the two
#     (tests/verbs/pair-apps.sh; the full build below includes both tools).
#     iperf3 and sockperf under rdmakit-run across the two VMs, every
#     connection on verbs (tests/verbs/pair-preload.sh).
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
# Everything: the guest runs the core, session, stream, kv and cp suites and tools
# (the release stage has usually built it all already).
ninja -C "$build" \
  >"$build.verbs-build.log" 2>&1 || { tail -30 "$build.verbs-build.log"; exit 1; }
start=$SECONDS
rc=0
tests/verbs/run-softroce-tests.sh --build-dir "$build" || rc=$?
echo "verbs stage: VM part $((SECONDS - start)) s"
exit $rc
