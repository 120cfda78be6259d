#!/usr/bin/env bash
# The whole --help text of a tool: `NAME --help`, then `NAME SUB --help` for
# each subcommand under a heading of its own, with the program shown as NAME
# (not the build path). gen-man.sh and check-options.sh read it.
#   help-text.sh NAME PATH [SUB...]
set -euo pipefail
name=$1 path=$2; shift 2
(exec -a "$name" "$path" --help)
for sub in "$@"; do
  printf '\nSubcommand %s:\n' "$sub"
  (exec -a "$name" "$path" "$sub" --help) | awk -v name="$name" -v sub_="$sub" '
    NR == 1 { sub("^" name " " sub_ ": *", ""); print; print ""; next }
    /^Usage: / {
      rest = $0; sub(/^Usage: /, "", rest)
      while (rest != "" && substr(rest, 1, 1) != "[") sub(/^[^ ]* ?/, "", rest)
      print name " " sub_ " " rest; next }
    /^Options:$/ { next }
    { print }'
done
