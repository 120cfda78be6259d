#!/usr/bin/env bash
# The providers' file layout (scripts/check_provider_files.py), clang-format
# check (no changes) over every C++ source, and clang-tidy (.clang-tidy's
# checks) over the library sources.
#   scripts/lint.sh [build-dir]   (compile_commands.json; configured if missing)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
# The providers' file layout against docs/architecture.md.
python3 scripts/check_provider_files.py
mapfile -t files < <(git ls-files '*.cpp' '*.hpp' | grep -v '^fuzz/corpus')
echo "lint: clang-format on ${#files[@]} files"
clang-format --dry-run -Werror "${files[@]}"
if [ ! -f "$build/compile_commands.json" ]; then
  cmake -S . -B "$build" -G Ninja -DRDMAKIT_BUILD_BENCH=OFF >/dev/null
fi
mapfile -t lib < <(git ls-files 'src/*.cpp')
echo "lint: clang-tidy on ${#lib[@]} library sources"
log=$(mktemp)
printf '%s\n' "${lib[@]}" |
  xargs -P "$(nproc)" -n 4 clang-tidy -p "$build" --quiet 2>/dev/null >"$log" || true
if grep -E "warning:|error:" "$log"; then
  rm -f "$log"
  exit 1
fi
rm -f "$log"
echo "lint: clean"
