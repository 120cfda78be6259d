#!/usr/bin/env bash
# CI stage: the Debian packages (docs/packaging.md). Builds librdmakit0,
# librdmakit-dev and rdmakit-tools (scripts/package.sh), unpacks a fresh
# Debian 12 chroot (mmdebstrap from the configured mirror; the tarball is
# cached under /var/cache/rdmakit-package, so a later run only unpacks it),
# installs the three .debs there with apt-get and runs
# tests/packaging/in-chroot.sh inside: rdmakit-perf --loopback, iperf3 under
# rdmakit-run on shm, the cp daemon from its unit file as its user, a
# find_package and a pkg-config consumer, man pages, lintian. Needs root.
set -euo pipefail
cd "$(dirname "$0")/../.."
start=$SECONDS
[ "$(id -u)" = 0 ] || { echo "package stage: needs root (chroot, mounts)"; exit 1; }
debs=$PWD/build-pkg/debs
scripts/package.sh "$debs"

# The base system: the chroot's own tools for the checks; the packages'
# dependencies come from the mirror when the .debs are installed.
include=iperf3,man-db,cmake,g++,make,pkg-config,lintian,util-linux,ca-certificates,systemd
cache=/var/cache/rdmakit-package
base=$cache/bookworm-$(echo "$include" | md5sum | cut -c1-8).tar
if [ ! -f "$base" ]; then
  mkdir -p "$cache"
  rm -f "$cache"/bookworm-*.tar     # an older include list's
  sources=/etc/apt/sources.list.d/debian.sources
  [ -f "$sources" ] || sources=/etc/apt/sources.list
  echo "package stage: creating $base (mmdebstrap bookworm, once)"
  mmdebstrap --mode=root --variant=apt --format=tar --include="$include" \
    bookworm "$base.tmp" "$sources" >"$base.log" 2>&1 || { tail -20 "$base.log"; exit 1; }
  mv "$base.tmp" "$base"
fi

chroot_dir=$(mktemp -d /tmp/rdmakit-package-chroot.XXXXXX)
cleanup() {
  for m in dev/shm proc; do umount "$chroot_dir/$m" 2>/dev/null || true; done
  mountpoint -q "$chroot_dir/dev/shm" || mountpoint -q "$chroot_dir/proc" ||
    rm -rf --one-file-system "$chroot_dir"
  echo "package stage: $((SECONDS - start)) s"
}
trap cleanup EXIT INT TERM
tar -C "$chroot_dir" -xf "$base"
mount -t proc proc "$chroot_dir/proc"
mkdir -p "$chroot_dir/dev/shm"
mount -t tmpfs -o mode=1777 tmpfs "$chroot_dir/dev/shm"
cp /etc/resolv.conf "$chroot_dir/etc/resolv.conf"
mkdir -p "$chroot_dir/tmp/debs"
cp "$debs"/*.deb "$chroot_dir/tmp/debs/"
cp -r tests/packaging "$chroot_dir/tmp/packaging"

in_chroot() { chroot "$chroot_dir" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root "$@"; }
apt_install() {
  echo "=== [package] apt-get install $* (chroot)"
  in_chroot sh -c 'cd /tmp/debs && apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $@' \
    sh "$@" >"$chroot_dir.apt.log" 2>&1 || { tail -30 "$chroot_dir.apt.log"; exit 1; }
  rm -f "$chroot_dir.apt.log"
}
# The tools and the library alone give working commands; -dev for the consumer.
apt_install './rdmakit-tools_*.deb' './librdmakit0_*.deb'
in_chroot sh -c 'for t in rdmakit-run rdmakit-cp rdmakit-kv rdmakit-perf rdmakit-info \
    rdmakit-mesh rdmakit-pingpong; do $t --help >/dev/null || exit 1; done;
  rdmakit-run --stats true && rdmakit-info | head -3'
apt_install './librdmakit-dev_*.deb'
in_chroot /tmp/packaging/in-chroot.sh /tmp/debs
