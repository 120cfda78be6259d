#!/usr/bin/env bash
# Builds the frame fuzzer with clang (ASan+UBSan+libFuzzer) and runs it for a
# bounded time on the seed corpus: the CI fuzz stage (tests/stages/fuzz.sh
# can simply exec this).
#   RDMAKIT_FUZZ_SECONDS   run time per target (default 120)
#   RDMAKIT_FUZZ_BUILD     build directory (default build-fuzz)
# Exit 0 = no crash, no sanitizer report, no timeout.
set -uo pipefail
cd "$(dirname "$0")/.."
seconds=${RDMAKIT_FUZZ_SECONDS:-120}
dir=${RDMAKIT_FUZZ_BUILD:-build-fuzz}
if ! command -v clang++ >/dev/null; then
  echo "fuzz: clang++ not installed"
  exit 1
fi
CC=clang CXX=clang++ cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DRDMAKIT_SANITIZE=address,undefined -DRDMAKIT_WITH_VERBS=OFF \
  -DRDMAKIT_BUILD_TESTS=OFF -DRDMAKIT_BUILD_BENCH=OFF \
  -DRDMAKIT_FUZZ_SECONDS="$seconds" >"$dir.configure.log" 2>&1 ||
  { tail -30 "$dir.configure.log"; exit 1; }
ninja -C "$dir" tcp_frame_fuzzer tcp_frame_replay stream_ring_fuzzer stream_ring_replay \
  kv_request_fuzzer kv_request_replay cp_record_fuzzer cp_record_replay \
  >"$dir.build.log" 2>&1 || { tail -40 "$dir.build.log"; exit 1; }
# Connection errors are what the fuzzer provokes; keep the log quiet.
RDMAKIT_LOG=off ctest --test-dir "$dir/fuzz" -L fuzz --output-on-failure --timeout $((seconds + 300))
rc=$?
grep -hE "^(#[0-9]+ +DONE|stat::number_of_executed_units|stat::average_exec_per_sec)" \
  "$dir"/fuzz/Testing/Temporary/LastTest.log 2>/dev/null | head -5
exit $rc
