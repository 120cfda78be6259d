#!/usr/bin/env bash
# run-in-softroce.sh -- run a command inside a throw-away qemu VM (stock Debian
# kernel) that has a Soft-RoCE (rdma_rxe) device, so libibverbs/librdmacm code
# can be exercised for real on a machine without RDMA hardware or CONFIG_INFINIBAND.
#
#   run-in-softroce.sh [--nodes 1|2] [--] CMD [ARGS...]
#   run-in-softroce.sh --setup        # only install host packages + build the VM image
#
# The guest sees the host's whole root filesystem (9p, read-only, with a tmpfs
# overlay on top: writes succeed but are thrown away), except the directories
# in SOFTROCE_RW (default: the current git checkout) which are
# shared read-write. /tmp, /run and /dev/shm are fresh tmpfs in the guest. So host-built
# binaries and every host tool/library run unchanged inside.
# The command runs as root in the current directory with the caller's
# environment; stdin is /dev/null; its stdout/stderr come back on this script's
# stdout/stderr; its exit status is this script's exit status.
#
# --nodes 1 (default): one VM; RDMA device rxe0 on a dummy netdev sr0 with
#   IPv4 10.77.0.1. Clients and servers talk over rxe loopback; no packet
#   leaves the guest (the VM has no NIC at all).
# --nodes 2: two VMs, each with rxe0 on its own virtio NIC; the two NICs are
#   joined by a Unix stream socket on the host (qemu -netdev stream), nothing
#   else is reachable. (rdmakit: a stream, not the original UDP socket pair,
#   which dropped ~0.1% of the frames when a busy emulated guest fell behind;
#   every drop cost rxe an ACK timeout and made two-VM runs slow and erratic.
#   SOFTROCE_LINK=udp restores it.) CMD runs on both; node 0 is 10.77.0.1, node 1
#   10.77.0.2. Output lines are prefixed [node0]/[node1]; the exit status is
#   the first non-zero one. /run/softroce-pair ($SOFTROCE_PAIR_DIR) is a
#   directory both guests see, for handshakes ("server ready" files).
# Inside, the command gets SOFTROCE_DEV=rxe0 SOFTROCE_IP SOFTROCE_PEER_IP
# SOFTROCE_NODE (0|1) SOFTROCE_NODES SOFTROCE_NETDEV SOFTROCE_GUEST=1.
#
# Exit status: the command's; 124 = SOFTROCE_TIMEOUT hit; 125 = the VM failed
# (its console log is then printed to stderr).
#
# Environment knobs:
#   SOFTROCE_TIMEOUT  seconds for the whole run, boot to power-off (default 900)
#   SOFTROCE_MEM      guest memory in MiB (default 2048)
#   SOFTROCE_SMP      guest vCPUs (default: host nproc; 1 per VM with --nodes 2)
#   SOFTROCE_ACCEL    auto|kvm|tcg (default auto: kvm only if a test boot under it works)
#   SOFTROCE_RW       colon-separated host dirs shared read-write (default: the git
#                     top-level of the current directory, or the directory itself)
#   SOFTROCE_CACHE    where kernel + initramfs are kept (default: /var/tmp/softroce-cache)
#   SOFTROCE_INSTALL  1 = apt-get install missing host packages (default 1 when root)
#   SOFTROCE_VERBOSE  1 = print the guest console log to stderr after the run
#   SOFTROCE_CPU      qemu -cpu model under TCG (default max)
# rdmakit: a copy of shared/softroce/run-in-softroce.sh, kept in the repo so the verbs
# tests need nothing outside it; tests/verbs/run-softroce-tests.sh drives it.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${SOFTROCE_CACHE:-/var/tmp/softroce-cache}
TIMEOUT=${SOFTROCE_TIMEOUT:-900}
MEM=${SOFTROCE_MEM:-2048}
ACCEL=${SOFTROCE_ACCEL:-auto}
if [ -n "${SOFTROCE_RW+x}" ]; then RW=$SOFTROCE_RW; else
  RW=$(git rev-parse --show-toplevel 2>/dev/null || pwd -P)
fi
VERBOSE=${SOFTROCE_VERBOSE:-0}
NODES=${SOFTROCE_NODES:-1}
if [ "$(id -u)" = 0 ]; then INSTALL=${SOFTROCE_INSTALL:-1}; else INSTALL=${SOFTROCE_INSTALL:-0}; fi

HOST_PKGS="qemu-system-x86 busybox-static xz-utils iproute2 rdma-core ibverbs-providers ibverbs-utils rdmacm-utils perftest"
MODULES="virtio_pci virtio_console 9pnet_virtio 9p overlay dummy veth virtio_net
  crc32_generic ib_core ib_uverbs udp_tunnel ip6_udp_tunnel rdma_rxe ib_cm iw_cm rdma_cm rdma_ucm ib_umad"

log() { echo "run-in-softroce: $*" >&2; }
die() { log "$*"; exit 125; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

# ---------------------------------------------------------------- host packages
ensure_packages() {
  local missing=() p
  for p in $HOST_PKGS; do
    dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  [ "$INSTALL" = 1 ] || die "missing host packages: ${missing[*]} (apt-get install them, or run as root)"
  log "installing ${missing[*]}"
  timeout 600 apt-get update -qq >&2 || true
  DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 \
    || die "apt-get install failed"
}

# ---------------------------------------------------------------- guest side
write_init() { # /init of the initramfs (busybox)
cat <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev

case " $(cat /proc/cmdline) " in *" softroce.probe "*) echo SOFTROCE-KVM-OK > /dev/ttyS0; poweroff -f; sleep 10;; esac
bye() { echo "softroce-init: $*" > /dev/ttyS0; sync; poweroff -f; sleep 10; }
for m in $(cat /modules.load); do
  args=; [ $m = dummy ] && args=numdummies=0
  insmod /mods/$m.ko $args 2>/dev/ttyS0 || echo "softroce-init: insmod $m failed" > /dev/ttyS0
done
O9P="trans=virtio,version=9p2000.L,msize=512000"
mount -t 9p -o $O9P,cache=none job /job || bye "cannot mount job share"
mount -t 9p -o $O9P,ro,cache=loose hostroot /lower || bye "cannot mount host root"
mount -t tmpfs -o mode=755 upper /upper && mkdir -p /upper/u /upper/w
if ! mount -t overlay -o lowerdir=/lower,upperdir=/upper/u,workdir=/upper/w overlay /newroot 2>/dev/ttyS0; then
  echo "softroce-init: overlay failed, using read-only root" > /dev/ttyS0
  mount --move /lower /newroot
fi
R=/newroot
mount --move /dev $R/dev
mount -t proc proc $R/proc
mount -t sysfs sysfs $R/sys
mkdir -p $R/dev/pts $R/dev/shm
mount -t devpts devpts $R/dev/pts
mount -t tmpfs -o mode=1777 shm $R/dev/shm
mount -t tmpfs -o mode=1777 tmp $R/tmp
mount -t tmpfs -o mode=755 run $R/run
mkdir -p $R/run/softroce
mount --move /job $R/run/softroce
while read -r tag path cache; do
  [ -n "$tag" ] || continue
  mkdir -p "$R$path"
  mount -t 9p -o $O9P,cache=${cache:-mmap} "$tag" "$R$path" || bye "cannot mount $tag on $path"
done < $R/run/softroce/mounts
# stdout/stderr ports (virtserialport, named by the host)
for d in /sys/class/virtio-ports/*; do
  [ -e "$d/name" ] || continue
  ln -sf /dev/$(basename $d) $R/run/softroce-$(cat $d/name)
done
chroot $R /bin/bash /run/softroce/guest.sh
sync
poweroff -f
sleep 10
EOF
}

write_guest_sh() { # runs inside the guest, chrooted into the host's root filesystem (host bash, ip, rdma)
cat <<'EOF'
J=/run/softroce
exec </dev/null >/dev/ttyS0 2>&1
. $J/config      # SOFTROCE_NODE SOFTROCE_NODES SOFTROCE_IP SOFTROCE_PEER_IP
PS4='+ [$(cut -d" " -f1 /proc/uptime)] '
set -x
ip link set lo up
if [ "$SOFTROCE_NODES" = 1 ]; then
  NETDEV=sr0; ip link add sr0 type dummy
else
  NETDEV=
  for n in /sys/class/net/*; do [ -e $n/device ] && { NETDEV=${n##*/}; break; }; done   # the virtio NIC
fi
ip addr add $SOFTROCE_IP/24 dev $NETDEV
ip link set $NETDEV up
rdma link add rxe0 type rxe netdev $NETDEV || { dmesg | tail -20; echo 125 > $J/rc; exit; }
for i in $(seq 100); do
  grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state 2>/dev/null && break; sleep 0.1
done
set +x
out=/run/softroce-out; err=/run/softroce-err
[ -e $err ] || err=$out
if [ "$SOFTROCE_NODES" != 1 ]; then   # prefix every line with the node's name
  mkfifo /run/softroce-o /run/softroce-e
  sed -u "s/^/[node$SOFTROCE_NODE] /" < /run/softroce-o > $out & p1=$!
  sed -u "s/^/[node$SOFTROCE_NODE] /" < /run/softroce-e > $err & p2=$!
  out=/run/softroce-o err=/run/softroce-e
fi
cd /
. $J/env
. $J/config
export SOFTROCE_NODE SOFTROCE_NODES SOFTROCE_IP SOFTROCE_PEER_IP SOFTROCE_DEV=rxe0 SOFTROCE_NETDEV=$NETDEV SOFTROCE_GUEST=1
[ "$SOFTROCE_NODES" = 1 ] || export SOFTROCE_PAIR_DIR=/run/softroce-pair
[ -n "${TMPDIR:-}" ] && mkdir -p "$TMPDIR"
cd "$(cat $J/cwd)" || { echo "run-in-softroce: cannot cd to $(cat $J/cwd)" > $err; echo 125 > $J/rc; exit; }
bash $J/cmd > $out 2> $err
rc=$?
[ "$SOFTROCE_NODES" = 1 ] || wait $p1 $p2
echo $rc > $J/rc.tmp
mv $J/rc.tmp $J/rc
EOF
}

# ---------------------------------------------------------------- kernel + initramfs
image_key() { { write_init; echo "$MODULES"; echo pvh; } | md5sum | cut -d' ' -f1; }

build_image() {
  local pkg tmp kv kdir m f
  pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
  if [ -z "$pkg" ]; then
    timeout 600 apt-get update -qq >&2 || true
    pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
  fi
  [ -n "$pkg" ] || die "cannot find the kernel package behind linux-image-amd64 (apt-get update?)"
  mkdir -p "$CACHE"
  tmp=$(mktemp -d "$CACHE/build.XXXXXX")
  log "building the VM image from $pkg (one-time)"
  ( cd "$tmp" && timeout 600 apt-get download "$pkg" >/dev/null 2>&1 ) || { rm -rf "$tmp"; die "apt-get download $pkg failed"; }
  dpkg-deb -x "$tmp"/*.deb "$tmp/k"
  kv=$(ls "$tmp/k/lib/modules" | head -1)
  kdir=$tmp/k/lib/modules/$kv
  busybox depmod -b "$tmp/k" "$kv"
  # load order: every module after its dependencies (modules.dep lists them transitively)
  : > "$tmp/order"
  add_mod() {
    grep -qxF "$1" "$tmp/order" && return 0
    local d
    for d in $(awk -v m="$1:" '$1==m{for(i=2;i<=NF;i++)print $i}' "$kdir/modules.dep" | tac); do add_mod "$d"; done
    echo "$1" >> "$tmp/order"
  }
  for m in $MODULES; do
    f=$(awk -F: -v m="$m" '{n=$1; sub(/.*\//,"",n); sub(/\.ko(\.xz|\.zst|\.gz)?$/,"",n); gsub(/-/,"_",n); if(n==m){print $1; exit}}' "$kdir/modules.dep")
    if [ -z "$f" ]; then grep -q "/${m//_/[-_]}\.ko" "$kdir/modules.builtin" && continue; rm -rf "$tmp"; die "module $m not found in $pkg"; fi
    add_mod "$f"
  done
  local ir=$tmp/initramfs
  mkdir -p "$ir"/{bin,dev,proc,sys,mods,job,lower,upper,newroot}
  cp /bin/busybox "$ir/bin/busybox"
  : > "$ir/modules.load"
  while read -r f; do
    case $f in
      *.ko.xz)  xz -dc "$kdir/$f" > "$ir/mods/$(basename "${f%.xz}")" ;;
      *.ko.zst) zstd -dqc "$kdir/$f" > "$ir/mods/$(basename "${f%.zst}")" ;;
      *.ko.gz)  gzip -dc "$kdir/$f" > "$ir/mods/$(basename "${f%.gz}")" ;;
      *)        cp "$kdir/$f" "$ir/mods/" ;;
    esac
    f=$(basename "$f"); echo "${f%%.ko*}" >> "$ir/modules.load"
  done < "$tmp/order"
  write_init > "$ir/init"
  chmod 755 "$ir/init"
  ( cd "$ir" && find . | busybox cpio -o -H newc 2>/dev/null | gzip -1 ) > "$tmp/initramfs.gz"
  mkdir -p "$tmp/img"
  mv "$tmp/initramfs.gz" "$tmp/img/"
  # boot the uncompressed ELF vmlinux through its PVH entry when it can be extracted
  # (skips the real-mode setup and the xz decompression: ~3 s less per boot under TCG)
  local off
  off=$(LC_ALL=C grep -obUaP '\xfd7zXZ\x00' "$tmp/k/boot/vmlinuz-$kv" | head -1 | cut -d: -f1)
  if [ -n "$off" ]; then tail -c +$((off + 1)) "$tmp/k/boot/vmlinuz-$kv" | xz -dc > "$tmp/img/vmlinux" 2>/dev/null || true; fi
  if [ "$(head -c 4 "$tmp/img/vmlinux" 2>/dev/null | od -An -tx1 | tr -d ' ')" = 7f454c46 ]; then
    mv "$tmp/img/vmlinux" "$tmp/img/vmlinuz"
  else
    cp "$tmp/k/boot/vmlinuz-$kv" "$tmp/img/vmlinuz"
  fi
  echo "$pkg $kv" > "$tmp/img/VERSION"
  image_key > "$tmp/img/KEY"
  rm -rf "$CACHE/img" "$CACHE/accel"
  mv "$tmp/img" "$CACHE/img"
  rm -rf "$tmp"
}

# ---------------------------------------------------------------- main
SETUP_ONLY=0
while [ $# -gt 0 ]; do
  case $1 in
    --setup) SETUP_ONLY=1; shift ;;
    --nodes) NODES=${2:-}; shift 2 ;;
    --nodes=*) NODES=${1#*=}; shift ;;
    --) shift; break ;;
    -h|--help) usage; exit 0 ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || [ "$SETUP_ONLY" = 1 ] || { usage >&2; exit 2; }
case $NODES in 1|2) ;; *) die "--nodes must be 1 or 2" ;; esac
if [ "$NODES" = 2 ]; then SMP=${SOFTROCE_SMP:-1}; else SMP=${SOFTROCE_SMP:-$(nproc)}; fi

ensure_packages
img_ok() { [ -s "$CACHE/img/initramfs.gz" ] && [ "$(cat "$CACHE/img/KEY" 2>/dev/null)" = "$(image_key)" ]; }
if ! img_ok; then
  mkdir -p "$CACHE"
  exec 8>"$CACHE/.lock"; flock 8     # one builder at a time
  img_ok || build_image
  exec 8>&-
fi

accel_args() {
  case $1 in
    kvm) echo "-accel kvm -cpu host" ;;
    tcg) echo "-accel tcg,thread=multi -cpu ${SOFTROCE_CPU:-max}" ;;
    *) die "SOFTROCE_ACCEL must be auto, kvm or tcg" ;;
  esac
}
if [ "$ACCEL" = auto ]; then
  if [ -s "$CACHE/accel" ]; then ACCEL=$(cat "$CACHE/accel"); else
    # /dev/kvm is not enough: under nested or paravirtual KVM (e.g. kvm_pvm) a stock
    # kernel may abort or hang, so boot it once and look for user space.
    ACCEL=tcg
    if [ -w /dev/kvm ] && ( ulimit -c 0; timeout 30 qemu-system-x86_64 -nodefaults -display none -no-reboot \
         -m 256 -accel kvm -cpu host -kernel "$CACHE/img/vmlinuz" -initrd "$CACHE/img/initramfs.gz" \
         -serial stdio -append "console=ttyS0 panic=-1 loglevel=1 softroce.probe" </dev/null ) 2>/dev/null \
         | grep -q SOFTROCE-KVM-OK; then ACCEL=kvm; fi
    echo "$ACCEL" > "$CACHE/accel"
  fi
fi
if [ "$SETUP_ONLY" = 1 ]; then log "ready: $(cat "$CACHE/img/VERSION"), accel $ACCEL"; exit 0; fi

JOB=$(mktemp -d "${TMPDIR:-/tmp}/softroce.XXXXXX")
QPIDS= CATS=
cleanup() {
  [ -z "$QPIDS" ] || kill $QPIDS 2>/dev/null || true
  [ -z "$CATS" ] || kill $CATS 2>/dev/null || true
  rm -rf "$JOB"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir "$JOB/common"
{ printf 'exec'; printf ' %q' "$@"; printf '\n'; } > "$JOB/common/cmd"
pwd > "$JOB/common/cwd"
export -p | grep -vE '^declare -x (PWD|OLDPWD|SHLVL|_|SOFTROCE_[A-Za-z_]*)=' > "$JOB/common/env" || true
write_guest_sh > "$JOB/common/guest.sh"

RWMOUNTS= RWARGS=() seen=()
i=0
IFS=: read -r -a rwdirs <<< "$RW"
for d in "${rwdirs[@]}"; do
  [ -n "$d" ] && [ -d "$d" ] || continue
  d=$(cd "$d" && pwd -P)
  [ "$d" = / ] && { [ -n "${SOFTROCE_RW+x}" ] && log "SOFTROCE_RW: ignoring /"; continue; }
  for e in ${seen[@]+"${seen[@]}"}; do case $d/ in "$e"/*) continue 2 ;; esac; done
  seen+=("$d")
  RWARGS+=(-virtfs "local,path=$d,mount_tag=rw$i,security_model=none,multidevs=remap")
  RWMOUNTS+="rw$i $d mmap"$'\n'; i=$((i+1))
done
if [ "$NODES" = 2 ]; then
  mkdir "$JOB/pair"      # seen by both guests, uncached, at /run/softroce-pair
  RWARGS+=(-virtfs "local,path=$JOB/pair,mount_tag=pair,security_model=none")
  RWMOUNTS+="pair /run/softroce-pair none"$'\n'
  PBASE=$((20000 + RANDOM % 30000))   # UDP ports on 127.0.0.1 (SOFTROCE_LINK=udp)
  LINK=${SOFTROCE_LINK:-stream}
fi

launch_node() { # $1 = node index
  local k=$1 d=$JOB/n$1 peer=$((1 - $1)) netargs=()
  mkdir -p "$d/share"
  cp "$JOB"/common/* "$d/share/"
  printf '%s' "$RWMOUNTS" > "$d/share/mounts"
  if [ "$NODES" = 1 ]; then
    printf 'SOFTROCE_NODE=0\nSOFTROCE_NODES=1\nSOFTROCE_IP=10.77.0.1\nSOFTROCE_PEER_IP=10.77.0.1\n' > "$d/share/config"
  else
    printf 'SOFTROCE_NODE=%d\nSOFTROCE_NODES=2\nSOFTROCE_IP=10.77.0.%d\nSOFTROCE_PEER_IP=10.77.0.%d\n' \
      "$k" $((k + 1)) $((peer + 1)) > "$d/share/config"
    if [ "$LINK" = udp ]; then
      netargs=(-netdev "socket,id=n0,udp=127.0.0.1:$((PBASE + peer)),localaddr=127.0.0.1:$((PBASE + k))")
    else  # node0 listens on the socket, node1 connects (started once it exists)
      netargs=(-netdev "stream,id=n0,server=$([ "$k" = 0 ] && echo on || echo off),addr.type=unix,addr.path=$JOB/link.sock")
    fi
    netargs+=(-device "virtio-net-pci,netdev=n0,mac=52:54:00:77:00:0$k")
  fi
  # stdout/stderr leave the guest through virtio serial ports; qemu writes them into
  # FIFOs relayed by tee to our own fds (works for files, pipes and ttys alike)
  # (tee -p + /dev/null keeps draining when our reader goes away, e.g. `... | head`,
  # so the guest never blocks on a full port)
  mkfifo "$d/out" "$d/err"
  tee -p /dev/null < "$d/out" & CATS+=" $!"
  tee -p /dev/null < "$d/err" >&2 & CATS+=" $!"
  # shellcheck disable=SC2046
  timeout --kill-after=10 "$TIMEOUT" qemu-system-x86_64 $(accel_args "$ACCEL") \
    -nodefaults -no-user-config -display none -no-reboot -m "$MEM" -smp "$SMP" \
    -kernel "$CACHE/img/vmlinuz" -initrd "$CACHE/img/initramfs.gz" \
    -append "console=ttyS0 loglevel=4 panic=-1 rdinit=/init" \
    -serial "file:$d/console.log" \
    -virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap" \
    -virtfs "local,path=$d/share,mount_tag=job,security_model=none" \
    "${RWARGS[@]}" ${netargs[@]+"${netargs[@]}"} \
    -device virtio-serial-pci \
    -chardev "file,id=out,path=$d/out" -device virtserialport,chardev=out,name=out \
    -chardev "file,id=err,path=$d/err" -device virtserialport,chardev=err,name=err \
    </dev/null >"$d/qemu.err" 2>&1 &
  QPIDS+=" $!"
}
for ((k = 0; k < NODES; k++)); do
  if [ "$k" = 1 ] && [ "${LINK:-}" = stream ]; then
    for _ in $(seq 100); do [ -S "$JOB/link.sock" ] && break; sleep 0.1; done
    [ -S "$JOB/link.sock" ] || die "node0's qemu did not create $JOB/link.sock: $(cat "$JOB/n0/qemu.err")"
  fi
  launch_node $k
done

set +e
tmo=0
for p in $QPIDS; do wait "$p"; q=$?; if [ $q = 124 ] || [ $q = 137 ]; then tmo=1; fi; done
QPIDS=
# let the relays drain and end (an O_RDWR open never blocks, and frees a relay still waiting in open())
for ((k = 0; k < NODES; k++)); do for f in out err; do exec 9<>"$JOB/n$k/$f"; exec 9>&-; done; done
wait $CATS
CATS=
set -e
rc=
for ((k = 0; k < NODES; k++)); do
  d=$JOB/n$k
  [ "$VERBOSE" = 1 ] && { echo "---- guest console, node$k ($ACCEL)"; cat "$d/console.log" "$d/qemu.err"; } >&2
  if [ -s "$d/share/rc" ]; then
    r=$(cat "$d/share/rc")
    [ "$NODES" = 2 ] && [ "$r" != 0 ] && log "node$k exited $r"
  elif [ $tmo = 1 ]; then
    log "node$k timed out after ${TIMEOUT}s (SOFTROCE_TIMEOUT)"; r=124
  else
    log "node$k: the VM ended without a result (accel $ACCEL); its console log:"
    cat "$d/console.log" "$d/qemu.err" >&2 || true
    r=125
  fi
  if [ -z "$rc" ] || [ "$rc" = 0 ]; then rc=$r; fi
done
exit "$rc"
