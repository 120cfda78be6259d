#!/usr/bin/env bash
# CI stage: the verbs provider under Soft-RoCE in one qemu VM (rxe loopback):
# rdmakit-info, the verbs tests and the conformance suite. The two-VM run
# (tests/verbs/run-softroce-tests.sh --two-vm) is run by hand; see
# docs/verbs-provider.md for its open cases.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${RDMAKIT_VERBS_BUILD:-build-test}
cmake -S . -B "$build" -G Ninja >/dev/null
ninja -C "$build" rdmakit_conformance rdmakit_verbs_test rdmakit-info >"$build.verbs-build.log" 2>&1 ||
  { tail -30 "$build.verbs-build.log"; exit 1; }
exec tests/verbs/run-softroce-tests.sh --build-dir "$build" --one-vm
