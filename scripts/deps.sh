#!/usr/bin/env bash
# Installs what building and testing rdmakit needs on Debian 12, if missing.
#   scripts/deps.sh            build + test dependencies
#   scripts/deps.sh --bench    also the peers bench/compare measures against
set -euo pipefail
pkgs=(cmake ninja-build g++ clang pkg-config libgtest-dev libgmock-dev libbenchmark-dev
      libfmt-dev libspdlog-dev libcli11-dev nlohmann-json3-dev libxxhash-dev
      libibverbs-dev librdmacm-dev libsodium-dev libclang-rt-14-dev iproute2 procps
      clang-format clang-tidy ccache)
# rdmakit-mesh: PMIx bootstrap under mpirun (tested), heat-map PNG.
pkgs+=(libpmix-dev openmpi-bin python3-matplotlib)
# The verbs stage: Soft-RoCE VMs (tests/verbs/softroce-vm.sh) and the
# rdmakit-perf cross-check run inside them.
pkgs+=(qemu-system-x86 busybox-static xz-utils rdma-core ibverbs-providers ibverbs-utils
       rdmacm-utils perftest python3)
[ "${1:-}" = "--bench" ] && pkgs+=(ucx-utils libfabric-bin sockperf iperf3 python3-matplotlib rsync)
# rdmakit-cp's sync tests compare it with rsync (trees with xattrs and ACLs,
# a private sshd for -e ssh).
pkgs+=(rsync attr acl openssh-server openssh-client)
# Packaging (man/, scripts/package.sh, the package stage): man pages from
# --help, dpkg-shlibdeps, lintian, the Debian 12 chroot.
pkgs+=(help2man dpkg-dev file lintian man-db mmdebstrap)
# The preload tests run these programs under the library.
pkgs+=(iperf3 sockperf curl redis-server redis-tools nginx-light wrk postgresql openssh-server
  socat netcat-openbsd memcached libmemcached-tools haproxy mosquitto mosquitto-clients lighttpd
  apache2-utils mariadb-server sysbench nodejs
  openssh-client systemd git)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "deps: installing ${missing[*]}"
sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
