#!/usr/bin/env bash
# Runs rdmakit's verbs tests on Soft-RoCE (rdma_rxe) in throw-away qemu VMs:
# first one VM (client and server over rxe loopback), then two VMs (two hosts,
# node0 the server role, node1 the client role). Build on the host first; the
# VMs only run the binaries (compiling under TCG emulation is ~35x slower).
#
#   cmake -S . -B build -G Ninja && ninja -C build rdmakit_conformance \
#       rdmakit_verbs_test rdmakit-info
#   tests/verbs/run-softroce-tests.sh [--build-dir build] [--one-vm|--two-vm]
#
# Needs root the first time (it apt-gets qemu, busybox, rdma-core and fetches
# a Debian kernel into /var/tmp/softroce-cache); later runs reuse the image.
# Takes about 3-4 minutes; each VM run is capped (SOFTROCE_TIMEOUT, default
# here 600 s) so CI stays well inside 15 minutes. Exit status: 0 when every
# step passed in both runs.
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
for bin in tests/verbs/rdmakit_verbs_test tools/rdmakit-info/rdmakit-info; do
  [ -x "$BUILD/$bin" ] || { echo "missing $BUILD/$bin: build it first" >&2; exit 2; }
done
export SOFTROCE_TIMEOUT=${SOFTROCE_TIMEOUT:-600}
VM=$HERE/softroce-vm.sh
"$VM" --setup || exit $?
rc=0
start=$SECONDS
if [ $RUN_ONE = 1 ]; then
  t0=$SECONDS
  echo "######## one VM (rxe loopback)"
  "$VM" "$HERE/guest-tests.sh" one-vm "$BUILD"; r=$?
  echo "######## one VM: exit $r in $((SECONDS - t0)) s"
  [ $r = 0 ] || rc=1
fi
if [ $RUN_TWO = 1 ]; then
  t0=$SECONDS
  echo "######## two VMs (node0 server, node1 client)"
  "$VM" --nodes 2 "$HERE/guest-tests.sh" two-vm "$BUILD"; r=$?
  echo "######## two VMs: exit $r in $((SECONDS - t0)) s"
  [ $r = 0 ] || rc=1
fi
echo "######## verbs tests $([ $rc = 0 ] && echo PASSED || echo FAILED) in $((SECONDS - start)) s"
exit $rc
