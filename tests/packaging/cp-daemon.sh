#!/usr/bin/env bash
# The packaged rdmakit-cp daemon as systemd would start it, without systemd:
# ExecStart= from the installed unit, as the unit's User=/Group=, with the
# LoadCredential= secret in $CREDENTIALS_DIRECTORY; then a push to it.
# Runs as root in the package stage's chroot, after the packages are installed.
set -euo pipefail
unit=/lib/systemd/system/rdmakit-cp.service
value() { sed -n "s/^$1=//p" "$unit" | tail -1; }
exec_start=$(value ExecStart)
user=$(value User) group=$(value Group)
credential=$(value LoadCredential)            # secret:/etc/rdmakit/cp.key
[ -n "$exec_start" ] && [ -n "$user" ] && [ -n "$credential" ] ||
  { echo "FAIL: $unit lacks ExecStart=, User= or LoadCredential="; exit 1; }
getent passwd "$user" >/dev/null || { echo "FAIL: no user $user (postinst)"; exit 1; }
key=${credential#*:}
[ -f "$key" ] && [ "$(stat -c %a "$key")" = 600 ] || { echo "FAIL: $key missing or not 0600"; exit 1; }
# What systemd does for LoadCredential=: a private copy owned by the user.
creds=/run/credentials/rdmakit-cp.service
mkdir -p "$creds" && install -o "$user" -g "$group" -m 0400 "$key" "$creds/${credential%%:*}"
chown "$user:$group" "$creds" && chmod 0500 "$creds"
command=${exec_start//\$\{CREDENTIALS_DIRECTORY\}/$creds}
mapfile -t environment < <(sed -n 's/^Environment=//p' "$unit")
echo "cp-daemon: as $user: ${environment[*]} $command"
log=/tmp/rdmakit-cp-daemon.log
# shellcheck disable=SC2086  # ExecStart= is split on spaces, as systemd does.
env "${environment[@]}" CREDENTIALS_DIRECTORY="$creds" setpriv --reuid="$user" --regid="$group" --init-groups \
  --no-new-privs $command >"$log" 2>&1 &
daemon=$!
trap 'kill $daemon 2>/dev/null || true; wait $daemon 2>/dev/null || true' EXIT
for _ in $(seq 50); do grep -q "listening on" "$log" && break; sleep 0.1; done
grep -q "listening on" "$log" || { echo "FAIL: daemon did not start:"; cat "$log"; exit 1; }
head -c 3000000 /dev/urandom >/tmp/cp-payload
# A local client admits the daemon's user on shm (docs/packaging.md).
RDMAKIT_SHM_ALLOW_UIDS=$user rdmakit-cp -q --secret-file "$key" /tmp/cp-payload 127.0.0.1:pushed
root=$(sed -n 's/^root *= *//p' /etc/rdmakit/cp.conf)
cmp /tmp/cp-payload "$root/pushed"
owner=$(stat -c %U "$root/pushed")
[ "$owner" = "$user" ] || { echo "FAIL: pushed file owned by $owner, not $user"; exit 1; }
echo "cp-daemon: PASS (push of 3 MB to the unit's daemon, file owned by $user)"
