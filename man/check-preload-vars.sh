#!/usr/bin/env bash
# Every RDMAKIT_PRELOAD* variable the preload library reads (a string
# literal in src/preload/) is in rdmakit-preload(7), that is in the variable
# table of docs/preload.md (ctest label packaging).
#   check-preload-vars.sh SRC_DIR PAGE
set -euo pipefail
src=$1 page=$2
vars=$(grep -rhoE '"RDMAKIT_PRELOAD[A-Z_]*"' "$src" | tr -d '"' | sort -u)
text=$(sed -e 's/\\-/-/g' -e 's/\\f[BIRP]//g' "$page")
missing=0
for v in $vars; do
  if ! grep -qE "(^|[^A-Z_])$v([^A-Z_]|$)" <<<"$text"; then
    echo "FAIL: $v is read in $src but not in $page (docs/preload.md's table)"
    missing=1
  fi
done
[ $missing -eq 0 ] && echo "PASS: $(wc -w <<<"$vars") variables, all in $page"
exit $missing
