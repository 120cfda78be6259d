#!/usr/bin/env bash
# Every option a tool's --help lists (and its subcommands' --help) appears in
# its man page (ctest label packaging).
#   check-options.sh NAME PATH MANPAGE [SUB...]
set -euo pipefail
name=$1 path=$2 page=$3; shift 3
here=$(cd "$(dirname "$0")" && pwd)
# The option lines of the help text: indented, starting with a dash.
options=$("$here/help-text.sh" "$name" "$path" "$@" |
  grep -E '^[[:space:]]+-' |
  grep -oE '(^|[[:space:],])--?[A-Za-z0-9][-A-Za-z0-9]*' | tr -d ' ,' | sort -u)
[ -n "$options" ] || { echo "FAIL: no options found in $name --help"; exit 1; }
# The page's text without roff escapes for dashes and fonts.
text=$(sed -e 's/\\-/-/g' -e 's/\\f[BIRP]//g' -e 's/\\(em/--/g' "$page")
missing=0
for opt in $options; do
  if ! grep -qE -- "(^|[^-A-Za-z0-9])$opt([^-A-Za-z0-9]|$)" <<<"$text"; then
    echo "FAIL: $name: option $opt is in --help but not in $page"
    missing=1
  fi
done
[ $missing -eq 0 ] && echo "PASS: $name: $(wc -w <<<"$options") options, all in $page"
exit $missing
