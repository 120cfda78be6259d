#!/usr/bin/env bash
# Starts a packaged daemon as systemd would, without systemd: ExecStart= of
# the installed unit, as its User=/Group=, with its Environment= and its
# LoadCredential= file copied into $CREDENTIALS_DIRECTORY (owned by the
# user, 0400). Prints the daemon's pid; its output goes to LOG.
#   unit-start.sh UNIT LOG      (as root, in the package stage's chroot)
set -euo pipefail
name=$1 log=$2
unit=/lib/systemd/system/$name
value() { sed -n "s/^$1=//p" "$unit" | tail -1; }
exec_start=$(value ExecStart)
user=$(value User) group=$(value Group)
credential=$(value LoadCredential)            # secret:/etc/rdmakit/cp.key
if [ -z "$exec_start" ] || [ -z "$user" ] || [ -z "$credential" ]; then
  echo "FAIL: $unit lacks ExecStart=, User= or LoadCredential=" >&2; exit 1
fi
getent passwd "$user" >/dev/null || { echo "FAIL: no user $user (postinst)" >&2; exit 1; }
key=${credential#*:}
if [ ! -f "$key" ] || [ "$(stat -c %a "$key")" != 600 ]; then
  echo "FAIL: $key missing or not 0600 (postinst)" >&2; exit 1
fi
creds=/run/credentials/$name
mkdir -p "$creds"
install -o "$user" -g "$group" -m 0400 "$key" "$creds/${credential%%:*}"
chown "$user:$group" "$creds" && chmod 0500 "$creds"
command=${exec_start//\$\{CREDENTIALS_DIRECTORY\}/$creds}
mapfile -t environment < <(sed -n 's/^Environment=//p' "$unit")
echo "unit-start: $name as $user: ${environment[*]} $command" >&2
# shellcheck disable=SC2086  # ExecStart= is split on spaces, as systemd does.
env "${environment[@]}" CREDENTIALS_DIRECTORY="$creds" setpriv --reuid="$user" \
  --regid="$group" --init-groups --no-new-privs $command >"$log" 2>&1 &
echo $!
