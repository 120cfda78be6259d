#!/usr/bin/env bash
# CI stage: the fuzzers (tcp frames, stream rings, kv requests and handshake,
# cp records; clang, ASan+UBSan), each for a bounded time.
set -euo pipefail
cd "$(dirname "$0")/../.."
RDMAKIT_FUZZ_SECONDS=${RDMAKIT_FUZZ_SECONDS:-20} exec fuzz/run_fuzz.sh
