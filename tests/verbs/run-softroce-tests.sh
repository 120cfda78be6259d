#!/usr/bin/env bash
# Runs rdmakit's verbs tests on Soft-RoCE (rdma_rxe) in throw-away qemu VMs:
# first one VM (client and server over rxe loopback), then two VMs (two hosts,
# node0 the server role, node1 the client role). Build on the host first; the
# VMs only run the binaries (compiling under TCG emulation is ~35x slower).
#
#   cmake -S . -B build -G Ninja && ninja -C build rdmakit_conformance \
#       rdmakit_verbs_test rdmakit-info rdmakit-perf
#   tests/verbs/run-softroce-tests.sh [--build-dir build] [--one-vm|--two-vm]
#
# One VM: rdmakit-info, rdmakit_verbs_test, the conformance suite and the
# rdmakit-perf cross-check (perf_crosscheck_verbs). Two VMs: rdmakit_verbs_test
# and the conformance suite split into server and client roles.
# Needs root the first time (it apt-gets qemu, busybox, rdma-core and fetches
# a Debian kernel into /var/tmp/softroce-cache); later runs reuse the image.
# Each VM run is capped (SOFTROCE_TIMEOUT, default here 540 s for one VM and
# 600 s for two), so the whole run stays inside CI's 15 minutes; the VMs are
# killed when this script is interrupted or a cap is hit. Exit status: 0 when
# every step passed in every run.
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BUILD=$REPO/build
RUN_ONE=1 RUN_TWO=1
while [ $# -gt 0 ]; do
  case $1 in
    --build-dir) BUILD=$2; shift 2 ;;
    --build-dir=*) BUILD=${1#*=}; shift ;;
    --one-vm) RUN_TWO=0; shift ;;
    --two-vm) RUN_ONE=0; shift ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
BUILD=$(cd "$BUILD" && pwd) || exit 2
for bin in tests/verbs/rdmakit_verbs_test tools/rdmakit-info/rdmakit-info \
           tests/rdmakit_conformance; do
  [ -x "$BUILD/$bin" ] || { echo "missing $BUILD/$bin: build it first" >&2; exit 2; }
done
[ $RUN_ONE = 0 ] || [ -x "$BUILD/tools/rdmakit-perf/rdmakit-perf" ] ||
  { echo "missing $BUILD/tools/rdmakit-perf/rdmakit-perf: build it first" >&2; exit 2; }
VM=$HERE/softroce-vm.sh
"$VM" --setup || exit $?
# The VM script kills its qemu processes on exit, INT and TERM; pass ours on.
child=
trap '[ -z "$child" ] || kill -TERM "$child" 2>/dev/null; wait; exit 130' INT TERM
# The guests' step results, repeated at the end (CI shows a log's tail).
results=$(mktemp /tmp/rdmakit-verbs-results.XXXXXX)
trap 'rm -f "$results"' EXIT
vm() {  # vm SECONDS ARGS...: one VM run in the background, so traps fire
  local secs=$1; shift
  SOFTROCE_TIMEOUT=${SOFTROCE_TIMEOUT:-$secs} "$VM" "$@" > >(tee -a "$results") &
  child=$!
  wait "$child"
  local r=$?
  child=
  return $r
}
rc=0
start=$SECONDS
if [ $RUN_ONE = 1 ]; then
  t0=$SECONDS
  echo "######## one VM (rxe loopback)"
  vm 540 "$HERE/guest-tests.sh" one-vm "$BUILD"; r=$?
  echo "######## one VM: exit $r in $((SECONDS - t0)) s"
  [ $r = 0 ] || rc=1
fi
if [ $RUN_TWO = 1 ]; then
  t0=$SECONDS
  echo "######## two VMs (node0 server, node1 client)"
  vm 600 --nodes 2 "$HERE/guest-tests.sh" two-vm "$BUILD"; r=$?
  echo "######## two VMs: exit $r in $((SECONDS - t0)) s"
  [ $r = 0 ] || rc=1
fi
echo "######## step results:"
grep -aE '==== .*(FAIL|step\(s\) failed|flaky)' "$results" || echo "(no step result: see above)"
echo "######## verbs tests $([ $rc = 0 ] && echo PASSED || echo FAILED) in $((SECONDS - start)) s"
exit $rc
