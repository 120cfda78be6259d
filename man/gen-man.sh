#!/usr/bin/env bash
# One man page from a tool's --help (help-text.sh) and its include file
# (DESCRIPTION, EXAMPLES, FILES, SEE ALSO) with help2man.
#   gen-man.sh NAME PATH VERSION INCLUDE OUT [SUB...]
set -euo pipefail
name=$1 path=$2 version=$3 include=$4 out=$5; shift 5
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# help2man runs "PROGRAM --help"; the wrapper is named after the tool.
{
  echo '#!/bin/sh'
  printf 'exec %q %q %q' "$here/help-text.sh" "$name" "$path"
  printf ' %q' "$@"
  echo
} >"$tmp/$name"
chmod +x "$tmp/$name"
args=(--no-info --no-discard-stderr --version-string="$version" --section=1
      --source=rdmakit --manual="rdmakit manual" --output="$out.tmp")
[ -f "$include" ] && args+=(--include="$include")
help2man "${args[@]}" "$tmp/$name"
mv "$out.tmp" "$out"
