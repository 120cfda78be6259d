# Sourced by attacker tests: a second Unix user for the test's lifetime.
#   . tests/support/second_user.sh
#   second_user_create           sets SECOND_USER, SECOND_UID, SECOND_GID (root only;
#                                returns 1 and says why otherwise)
#   as_second_user CMD...        runs CMD as that user (setpriv, no new privileges,
#                                supplementary groups cleared)
#   second_user_stage DIR BIN    copies BIN, and the libraries it loads from outside the
#                                system's directories (the build tree's), into DIR (0755);
#                                sets SECOND_USER_BIN to the copy (as_second_user finds its
#                                libraries): a checkout may sit where the second user
#                                cannot reach (a 0700 temporary directory)
#   second_user_remove           deletes the user and its processes (also on EXIT
#                                when second_user_create installed the trap)
# The user has no home directory and no login shell; its name is unique per
# test run, so parallel tests never share one.
second_user_create() {
  if [ "$(id -u)" != 0 ]; then
    echo "second_user_create: needs root (useradd)"; return 1
  fi
  SECOND_USER="rdk$$$(printf %04d $((RANDOM % 10000)))"
  SECOND_USER=${SECOND_USER:0:31}
  useradd --system --no-create-home --shell /usr/sbin/nologin --user-group "$SECOND_USER" ||
    { echo "second_user_create: useradd $SECOND_USER failed"; return 1; }
  SECOND_UID=$(id -u "$SECOND_USER")
  SECOND_GID=$(id -g "$SECOND_USER")
  export SECOND_USER SECOND_UID SECOND_GID
  trap 'second_user_remove' EXIT
}

as_second_user() {
  setpriv --reuid "$SECOND_UID" --regid "$SECOND_GID" --clear-groups --no-new-privs \
    --reset-env -- env PATH="$PATH" ${SECOND_USER_LIBS:+LD_LIBRARY_PATH="$SECOND_USER_LIBS"} "$@"
}

second_user_stage() {
  local dir=$1 bin=$2 lib
  mkdir -p "$dir" && chmod 755 "$dir" || return 1
  cp "$bin" "$dir/" && chmod 755 "$dir/$(basename "$bin")" || return 1
  for lib in $(ldd "$bin" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3}'); do
    case $lib in /lib/* | /usr/*) continue ;; esac
    cp -L "$lib" "$dir/$(basename "$lib")" && chmod 755 "$dir/$(basename "$lib")" || return 1
  done
  SECOND_USER_LIBS=$dir
  SECOND_USER_BIN=$dir/$(basename "$bin")
}

second_user_remove() {
  [ -n "${SECOND_USER:-}" ] || return 0
  pkill -9 -u "$SECOND_UID" 2>/dev/null
  sleep 0.1
  userdel "$SECOND_USER" 2>/dev/null
  SECOND_USER=
}
