#!/usr/bin/env bash
# Lists the dynamic symbols a shared library defines and fails on any that
# is not rdmakit's public API:
#  - allowed: rdmakit::<name> and the typeinfo, typeinfo name and vtable of
#    an rdmakit class (what the C++ ABI needs to throw, catch and derive
#    across the library boundary);
#  - refused: anything else (std:: template instantiations, C names, libc or
#    spdlog/fmt symbols), and the internal namespaces rdmakit::core, ::shm,
#    ::tcp, ::verbs (or any rdmakit::...::(anonymous namespace));
#  - required: a few API entry points, so a broken export macro fails too.
# Usage: check_exports.sh LIBRARY.so
set -uo pipefail
lib=${1:?usage: check_exports.sh LIBRARY.so}
[ -f "$lib" ] || { echo "no such library: $lib"; exit 1; }
# Symbol type A is the version node (RDMAKIT_0), not code or data.
symbols=$(nm -D --defined-only "$lib" | awk '$2 != "A" { $1 = ""; $2 = ""; sub(/^  /, ""); print }' | c++filt)
[ -n "$symbols" ] || { echo "FAIL: $lib exports no symbols at all"; exit 1; }

allowed='^(rdmakit::|typeinfo for rdmakit::|typeinfo name for rdmakit::|vtable for rdmakit::)'
internal='rdmakit::(core|shm|tcp|verbs|detail)::|\(anonymous namespace\)'
bad=$(grep -Ev "$allowed" <<<"$symbols")
leaked=$(grep -E "$internal" <<<"$symbols")
status=0
if [ -n "$bad" ]; then
  echo "FAIL: symbols outside namespace rdmakit:"
  sed 's/^/  /' <<<"$bad"
  status=1
fi
if [ -n "$leaked" ]; then
  echo "FAIL: internal symbols exported:"
  sed 's/^/  /' <<<"$leaked"
  status=1
fi
for api in 'rdmakit::Context::open(' 'rdmakit::status_name(' 'rdmakit::list_devices(' \
           'rdmakit::RemoteRegion::deserialize(' 'rdmakit::CompletionQueue::wait(' \
           'typeinfo for rdmakit::Error'; do
  if ! grep -qF "$api" <<<"$symbols"; then
    echo "FAIL: API symbol missing: $api"
    status=1
  fi
done
echo "$(wc -l <<<"$symbols") exported symbols checked in $lib"
[ $status -eq 0 ] && echo "PASS: only rdmakit's public API is exported"
exit $status
