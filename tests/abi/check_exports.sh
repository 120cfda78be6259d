#!/usr/bin/env bash
# Lists the dynamic symbols a shared library defines and fails on any that
# is not the library's public API:
#  - allowed: NAMESPACE::<name> and the typeinfo, typeinfo name and vtable of
#    a class of NAMESPACE (what the C++ ABI needs to throw, catch and derive
#    across the library boundary);
#  - refused: anything else (std:: template instantiations, C names, libc or
#    spdlog/fmt symbols, another rdmakit library's names), and symbols named
#    in an internal namespace: rdmakit::core, ::shm, ::tcp, ::verbs, any
#    ...::detail, any (anonymous namespace). A parameter of an internal type
#    (a public class's private constructor) is not a name of its own;
#  - required: each API entry point given, so a broken export macro or
#    version script fails too.
# Usage: check_exports.sh LIBRARY.so NAMESPACE API...
#   e.g. check_exports.sh librdmakit-stream.so rdmakit::stream 'rdmakit::stream::Engine::create('
set -uo pipefail
lib=${1:?usage: check_exports.sh LIBRARY.so NAMESPACE API...}
ns=${2:?usage: check_exports.sh LIBRARY.so NAMESPACE API...}
shift 2
[ $# -gt 0 ] || { echo "check_exports.sh: name at least one API symbol of $lib"; exit 2; }
[ -f "$lib" ] || { echo "no such library: $lib"; exit 1; }
# Symbol type A is the version node (RDMAKIT_0, ...), not code or data; the
# @@version suffix is dropped.
symbols=$(nm -D --defined-only "$lib" |
  awk '$2 != "A" { $1 = ""; $2 = ""; sub(/^  /, ""); print }' | c++filt | sed 's/@@*[A-Z0-9_]*$//')
[ -n "$symbols" ] || { echo "FAIL: $lib exports no symbols at all"; exit 1; }

nsre=${ns//./\\.}
allowed="^(typeinfo for |typeinfo name for |vtable for )?${nsre}::"
# The symbol's own name: what precedes its parameter list.
names=$(sed -E 's/^(typeinfo for |typeinfo name for |vtable for )//; s/\(.*//' <<<"$symbols")
internal='^rdmakit::([a-z_]+::)*(core|shm|tcp|verbs|detail)::'
bad=$(grep -Ev "$allowed" <<<"$symbols")
leaked=$( (grep -E "$internal" <<<"$names"; grep -F '(anonymous namespace)' <<<"$symbols") | sort -u)
status=0
if [ -n "$bad" ]; then
  echo "FAIL: symbols outside namespace $ns:"
  sed 's/^/  /' <<<"$bad"
  status=1
fi
if [ -n "$leaked" ]; then
  echo "FAIL: internal symbols exported:"
  sed 's/^/  /' <<<"$leaked"
  status=1
fi
for api in "$@"; do
  if ! grep -qF "$api" <<<"$symbols"; then
    echo "FAIL: API symbol missing: $api"
    status=1
  fi
done
echo "$(wc -l <<<"$symbols") exported symbols checked in $lib"
[ $status -eq 0 ] && echo "PASS: only the public API of $ns is exported"
exit $status
