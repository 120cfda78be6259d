#!/usr/bin/env bash
# rdmakit-cp serve under attack (docs/cp.md, "Security"): each attack must
# fail closed, and a genuine client must still work afterwards on the same
# server.
#   cp_security_test.sh BINARY PROVIDER
# Covered: default loopback bind, a non-loopback bind without secret refused;
# clients without, with a wrong and with a replayed proof; a client with a
# secret against a server without one; --read-only / --write-only;
# setuid/setgid/sticky dropped both ways (kept with --preserve-special);
# hostile declared sizes (2^52, 1 TiB, lies against the data) and
# --max-client-bytes; '..' and symlinked last components with openat2 and
# with the per-component fallback (RDMAKIT_CP_NO_OPENAT2=1). As root on tcp,
# an unprivileged second user (tests/support/second_user.sh) is the attacker
# of a root daemon, and the service user a daemon runs as.
# Loopback addresses only; every wait is bounded.
set -u
bin=${1:?binary}
provider=${2:-tcp}
here=$(cd "$(dirname "$0")" && pwd)
host=127.0.0.1
base=/dev/shm
[ -d "$base" ] && [ -w "$base" ] || base=${TMPDIR:-/tmp}
work=$(mktemp -d "$base/rdmakit-cp-sec.XXXXXX")
chmod 755 "$work"
server_pid=
cleanup() {
  [ -n "$server_pid" ] && kill -9 "$server_pid" 2>/dev/null
  wait 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
pass() { echo "ok: $*"; }
check() {  # check DESCRIPTION COMMAND...: pass if the command succeeds
  local what=$1; shift
  if "$@"; then pass "$what"; else fail "$what"; tail -3 "$work/err" 2>/dev/null; fi
}
cp_() { timeout --kill-after=5 60 "$bin" -q --provider "$provider" -p "$port" "$@"; }

start_server() {  # start_server ROOT [SERVE ARGS...]; env via server_env
  local root=$1; shift
  rm -f "$work/port"
  env ${server_env:-} "$bin" serve --root "$root" -p 0 --port-file "$work/port" \
    --provider "$provider" "$@" 2>>"$work/server.log" &
  server_pid=$!
  for _ in $(seq 100); do [ -s "$work/port" ] && break; sleep 0.05; done
  port=$(cat "$work/port" 2>/dev/null) || { fail "server did not start"; tail "$work/server.log"; exit 1; }
}
stop_server() {
  kill "$server_pid" 2>/dev/null
  timeout 10 tail --pid="$server_pid" -f /dev/null
  wait "$server_pid" 2>/dev/null
  server_pid=
}
alive() { kill -0 "$server_pid" 2>/dev/null; }
# A genuine client still works: push and pull back a fresh file.
genuine() {  # genuine LABEL [CLIENT ARGS...]
  local label=$1; shift
  head -c 5000 /dev/urandom >"$work/g.src"
  if alive && cp_ "$@" "$work/g.src" "$host:g-$label" 2>"$work/err" &&
     cp_ "$@" "$host:g-$label" "$work/g.back" 2>>"$work/err" && cmp -s "$work/g.src" "$work/g.back"; then
    pass "$label: the server is alive and a genuine client works"
  else fail "$label: genuine client after the attack"; cat "$work/err"; fi
  rm -f "$work/g.back"
}
refused() {  # refused EXPECTED_RC PATTERN: last client's exit and message
  [ "$rc" = "$1" ] && grep -q -- "$2" "$work/err"
}

mkdir -p "$work/root" "$work/outside" "$work/pulled"
echo secret >"$work/outside/secret"
echo data >"$work/file"
head -c 32 /dev/urandom | base64 >"$work/key"; chmod 600 "$work/key"
head -c 32 /dev/urandom | base64 >"$work/wrong"; chmod 600 "$work/wrong"
have_user=0
# On tcp only: on shm a client of another user fails to connect at all
# (the session setup is reset), so there is nothing to attack there.
if [ "$(id -u)" = 0 ] && [ "$provider" = tcp ]; then
  . "$here/../support/second_user.sh"
  if second_user_create; then
    have_user=1
    trap 'second_user_remove; cleanup' EXIT
    mkdir "$work/user" && chown "$SECOND_USER:" "$work/user"
    second_user_stage "$work/user-bin" "$bin" || { echo "FAIL: staging $bin"; exit 1; }
  fi
fi
as_user_cp() {  # the unprivileged attacker's client
  as_second_user timeout --kill-after=5 60 "$SECOND_USER_BIN" -q --provider "$provider" \
    -p "$port" "$@"
}

# --- Closed by default -------------------------------------------------------
timeout 20 "$bin" serve --root "$work/root" -p 0 --provider "$provider" --bind 0.0.0.0 \
  2>"$work/err"
rc=$?
check "non-loopback bind without a secret refused (says --no-auth)" refused 1 "--no-auth"
start_server "$work/root"
check "default bind is loopback, logged with authentication off" \
  grep -q "listening on 127.0.0.1:.*authentication OFF: any local user" "$work/server.log"
cp_ --secret-file "$work/key" "$work/file" "$host:x" 2>"$work/err"; rc=$?
check "a client with a secret refuses a server without one" \
  refused 4 "authentication failed: the server has no secret"
[ -e "$work/root/x" ] && fail "pushed although the client refused the server"
genuine "no-secret server"
stop_server

# --- Authentication ----------------------------------------------------------
start_server "$work/root" --secret-file "$work/key"
check "authentication on, logged" grep -q "authentication on (file $work/key)" "$work/server.log"
cp_ "$work/file" "$host:x" 2>"$work/err"; rc=$?
check "unauthenticated client refused (exit 4, clear error)" \
  refused 4 "the server requires a secret (--secret-file or RDMAKIT_SECRET)"
check "server logs the unauthenticated peer" grep -q "serve: .*: refused: no authentication" "$work/server.log"
cp_ "$host:g-none" "$work/pulled/x" 2>"$work/err"; rc=$?
check "unauthenticated pull refused" refused 4 "requires a secret"
cp_ --secret-file "$work/wrong" "$work/file" "$host:x" 2>"$work/err"; rc=$?
check "wrong-secret client refused (exit 4)" refused 4 "authentication failed: wrong secret"
for _ in $(seq 40); do grep -q "authentication failed: no proof" "$work/server.log" && break; sleep 0.25; done
check "server logs the wrong-secret peer" grep -q "serve: .*: authentication failed" "$work/server.log"
[ -e "$work/root/x" ] && fail "an unauthenticated client wrote x"
RDMAKIT_CP_TEST_AUTH_RECORD="$work/recorded" cp_ --secret-file "$work/key" "$work/file" "$host:rec" 2>"$work/err"
rc=$?
check "genuine client (proof recorded)" test $rc = 0 -a -s "$work/recorded"
RDMAKIT_CP_TEST_AUTH_REPLAY="$work/recorded" cp_ "$work/file" "$host:replayed" 2>"$work/err"; rc=$?
check "replayed client proof refused" refused 4 "authentication failed: wrong secret"
check "server logs the replay" grep -q "refused: authentication failed (wrong secret, or a replayed proof)" "$work/server.log"
[ -e "$work/root/replayed" ] && fail "the replaying client wrote"
RDMAKIT_SECRET=$(cat "$work/key") cp_ "$work/file" "$host:env" 2>"$work/err"
check "secret from RDMAKIT_SECRET" cmp -s "$work/file" "$work/root/env"
if [ $have_user = 1 ]; then
  echo mine >"$work/user/f"; chown "$SECOND_USER:" "$work/user/f"
  as_user_cp "$work/user/f" "$host:by-user" 2>"$work/err"; rc=$?
  check "unprivileged local user without the secret refused" refused 4 "requires a secret"
  [ -e "$work/root/by-user" ] && fail "the unprivileged user wrote"
fi
genuine "authenticated server" --secret-file "$work/key"

# --- Modes: setuid/setgid/sticky never from the network by default ------------
mkdir -p "$work/modes"
for m in 4755 2755 1777 6755; do echo "$m" >"$work/modes/m$m"; chmod "$m" "$work/modes/m$m"; done
cp_ --secret-file "$work/key" "$work/modes/m4755" "$work/modes/m2755" "$work/modes/m1777" \
  "$work/modes/m6755" "$host:." 2>"$work/err"
ok=1
for m in 4755 2755 1777 6755; do
  got=$(stat -c %a "$work/root/m$m" 2>/dev/null)
  [ "$got" = "$(printf %o $((8#$m & 8#777)))" ] || { ok=0; echo "m$m landed as $got"; }
done
check "pushed 4755/2755/1777/6755 land without special bits" test $ok = 1
cp_ --secret-file "$work/key" "$host:m4755" "$work/pulled/m4755" 2>"$work/err"
# The server's own setuid file (a hostile server): the pulling client drops it.
chmod 4755 "$work/root/m4755"
cp_ --secret-file "$work/key" "$host:m4755" "$work/pulled/p4755" 2>"$work/err"
check "a setuid file pulled from a server lands without setuid" \
  test "$(stat -c %a "$work/pulled/p4755" 2>/dev/null)" = 755
cp_ --secret-file "$work/key" --preserve-special "$host:m4755" "$work/pulled/k4755" 2>"$work/err"
check "pull --preserve-special keeps setuid" test "$(stat -c %a "$work/pulled/k4755" 2>/dev/null)" = 4755
if [ $have_user = 1 ]; then
  cp "$work/modes/m4755" "$work/user/suid"; chown "$SECOND_USER:" "$work/user/suid"; chmod 4755 "$work/user/suid"
  stop_server
  start_server "$work/root"  # loopback, no secret: any local user may push
  as_user_cp "$work/user/suid" "$host:user-suid" 2>"$work/err"
  check "unprivileged user's 4755 lands in a root daemon's tree as 755 (root-owned, no setuid)" \
    test "$(stat -c '%a %U' "$work/root/user-suid" 2>/dev/null)" = "755 root"
  genuine "after the unprivileged push"
fi
stop_server
start_server "$work/root" --secret-file "$work/key" --preserve-special
cp_ --secret-file "$work/key" "$work/modes/m4755" "$work/modes/m1777" "$host:." 2>"$work/err"
check "serve --preserve-special keeps 4755 and 1777" \
  test "$(stat -c %a "$work/root/m4755")$(stat -c %a "$work/root/m1777")" = 47551777
stop_server

# --- A daemon run as a service user ----------------------------------------
# Its key file is its own; a client with the key (root here) pushes a 4755
# file: it lands 0755 and owned by the service user; a client without the
# key is refused; the daemon cannot write outside its own tree.
if [ $have_user = 1 ]; then
  mkdir "$work/svc"; cp "$work/key" "$work/svc.key"
  chown "$SECOND_USER:" "$work/svc" "$work/svc.key"; chmod 600 "$work/svc.key"
  rm -f "$work/user/port"  # (a directory the service user may write)
  as_second_user "$SECOND_USER_BIN" serve --root "$work/svc" -p 0 --port-file "$work/user/port" \
    --provider "$provider" --secret-file "$work/svc.key" 2>>"$work/server.log" &
  server_pid=$!
  for _ in $(seq 100); do [ -s "$work/user/port" ] && break; sleep 0.05; done
  port=$(cat "$work/user/port" 2>/dev/null) || { fail "service-user server did not start"; tail -5 "$work/server.log"; }
  cp_ "$work/file" "$host:x" 2>"$work/err"; rc=$?
  check "service-user daemon refuses a client without the secret" refused 4 "requires a secret"
  cp_ --secret-file "$work/key" "$work/modes/m4755" "$host:." 2>"$work/err"
  check "service-user daemon: pushed 4755 lands 0755, owned by the service user" \
    test "$(stat -c '%a %U' "$work/svc/m4755" 2>/dev/null)" = "755 $SECOND_USER"
  genuine "service-user daemon" --secret-file "$work/key"
  stop_server
fi

# --- --read-only / --write-only --------------------------------------------
start_server "$work/root" --secret-file "$work/key" --read-only
cp_ --secret-file "$work/key" "$work/file" "$host:ro" 2>"$work/err"; rc=$?
check "--read-only refuses a push (exit 4)" refused 4 "read-only"
[ -e "$work/root/ro" ] && fail "--read-only server was written"
cp_ --secret-file "$work/key" "$host:env" "$work/pulled/ro" 2>"$work/err"
check "--read-only serves pulls" cmp -s "$work/file" "$work/pulled/ro"
stop_server
start_server "$work/root" --secret-file "$work/key" --write-only
cp_ --secret-file "$work/key" "$host:env" "$work/pulled/wo" 2>"$work/err"; rc=$?
check "--write-only refuses a pull (exit 4)" refused 4 "write-only"
[ -e "$work/pulled/wo" ] && fail "--write-only server served a pull"
cp_ --secret-file "$work/key" "$work/file" "$host:wo" 2>"$work/err"
check "--write-only accepts pushes" cmp -s "$work/file" "$work/root/wo"
stop_server

# --- Hostile sizes ---------------------------------------------------------
head -c 4095 /dev/urandom >"$work/odd"
: >"$work/zero"
head -c $((3 * 1024 * 1024)) /dev/urandom >"$work/three"
start_server "$work/root" --secret-file "$work/key" --max-client-bytes 2M
lie() {  # lie DECLARED FILE DEST PATTERN DESCRIPTION
  RDMAKIT_CP_TEST_DECLARE_SIZE=$1 cp_ --secret-file "$work/key" "$2" "$host:$3" 2>"$work/err"
  rc=$?
  if [ $rc != 0 ] && grep -q -- "$4" "$work/err" && [ ! -e "$work/root/$3" ] && alive; then
    pass "$5: refused (exit $rc), the daemon lives"
  else fail "$5: exit $rc"; cat "$work/err"; fi
}
lie $((1 << 52)) "$work/odd" big "exceeds the limit" "a file declared 2^52 bytes"
lie $((1 << 40)) "$work/odd" tib "byte limit\|no space" "a file declared 1 TiB"
lie 0 "$work/odd" zero-lie "outside the declared size" "4095 bytes sent for a declared 0"
lie 10 "$work/odd" short-lie "outside the declared size" "4095 bytes sent for a declared 10"
lie 18446744073709551615 "$work/odd" max-lie "exceeds the limit" "a file declared 2^64-1 bytes"
cp_ --secret-file "$work/key" "$work/zero" "$host:zero" 2>"$work/err"
check "a true zero-size file is accepted" test -f "$work/root/zero" -a ! -s "$work/root/zero"
cp_ --secret-file "$work/key" "$work/three" "$host:three" 2>"$work/err"; rc=$?
check "--max-client-bytes 2M refuses a 3 MiB file" refused 4 "max-client-bytes"
[ -e "$work/root/three" ] && fail "a file over --max-client-bytes landed"
genuine "hostile sizes" --secret-file "$work/key"
stop_server
if [ "$(id -u)" = 0 ] && mkdir "$work/tiny" && mount -t tmpfs -o size=2m tiny "$work/tiny" 2>/dev/null; then
  start_server "$work/tiny" --secret-file "$work/key"
  cp_ --secret-file "$work/key" "$work/three" "$host:three" 2>"$work/err"; rc=$?
  check "a file over the free space is refused before writing" \
    test $rc = 2 -a ! -e "$work/tiny/three" -a "$(du -s "$work/tiny" | cut -f1)" -lt 64
  grep -q "no space left on device.*declared" "$work/err" || fail "free-space refusal not named"
  genuine "free space" --secret-file "$work/key"
  stop_server
  umount "$work/tiny"
fi

# --- Confinement: '..' and symlinked last components, both methods ----------
ln -s "$work/outside" "$work/root/to-dir"
ln -s "$work/outside/secret" "$work/root/to-file"
mkdir -p "$work/root/d"; ln -s "$work/outside/secret" "$work/root/d/f"
for method in openat2 fallback; do
  server_env=
  [ $method = fallback ] && server_env=RDMAKIT_CP_NO_OPENAT2=1
  start_server "$work/root" --secret-file "$work/key"
  [ $method = fallback ] && { grep -q "openat2 disabled" "$work/server.log" || fail "fallback not used"; }
  for dst in ../x to-dir to-dir/x to-file d/../../x; do
    cp_ --secret-file "$work/key" "$work/file" "$host:$dst" 2>"$work/err"; rc=$?
    check "$method: push to $dst refused (exit 4)" refused 4 "refused"
  done
  cp_ --secret-file "$work/key" "$work/file" "$host:d" 2>"$work/err"
  # d/file is new; d/f is a symlink to outside: replaced, never followed.
  mkdir -p "$work/srcd/d"; echo over >"$work/srcd/d/f"
  cp_ --secret-file "$work/key" -r "$work/srcd/d" "$host:." 2>"$work/err"
  check "$method: a tree over a symlinked last component never writes through it" \
    test "$(cat "$work/outside/secret")" = secret
  ln -sfn "$work/outside/secret" "$work/root/d/f"
  for s in ../outside/secret to-dir/secret; do
    cp_ --secret-file "$work/key" "$host:$s" "$work/pulled/got" 2>"$work/err"; rc=$?
    check "$method: pull of $s refused" test $rc = 4 -a ! -e "$work/pulled/got"
  done
  rm -f "$work/pulled/got"
  cp_ --secret-file "$work/key" "$host:to-file" "$work/pulled/got" 2>"$work/err"
  check "$method: pull of a symlinked last component gives no outside content" \
    test ! -f "$work/pulled/got" -o -L "$work/pulled/got"
  rm -f "$work/pulled/got"
  check "$method: nothing written outside" test "$(ls "$work/outside")" = secret -a "$(cat "$work/outside/secret")" = secret
  genuine "$method confinement" --secret-file "$work/key"
  stop_server
done
server_env=

if grep -qE "Sanitizer|runtime error" "$work/server.log"; then
  grep -E -A20 "Sanitizer|runtime error" "$work/server.log" | head -60
  fail "sanitizer report in the server log"
fi
grep -q "Segmentation\|core dumped" "$work/server.log" && fail "the server crashed"
[ $fails = 0 ] || { echo "$fails failure(s)"; tail -30 "$work/server.log"; exit 1; }
echo "all passed"
