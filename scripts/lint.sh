#!/usr/bin/env bash
# clang-format check (no changes) and clang-tidy over the library sources.
#   scripts/lint.sh [build-dir-with-compile_commands.json]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
mapfile -t files < <(git ls-files '*.cpp' '*.hpp' | grep -v '^fuzz/corpus')
clang-format --dry-run -Werror "${files[@]}"
mapfile -t lib < <(git ls-files 'src/*.cpp')
clang-tidy -p "$build" --quiet "${lib[@]}" 2>/dev/null | tee /tmp/rdmakit-tidy.log | grep -E "warning:|error:" && exit 1
echo "lint: clean"
