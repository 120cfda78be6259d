#!/usr/bin/env bash
# CI stage: the tcp frame fuzzer (clang, ASan+UBSan) for a bounded time.
set -euo pipefail
cd "$(dirname "$0")/../.."
RDMAKIT_FUZZ_SECONDS=${RDMAKIT_FUZZ_SECONDS:-60} exec fuzz/run_fuzz.sh
