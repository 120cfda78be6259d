#!/usr/bin/env bash
# Two hosts on one machine: network namespaces A (10.200.0.1/24) and B
# (10.200.0.2/24) joined by a veth pair. Runs
#   1. the conformance suite over tcp with the server in A, the client in B;
#   2. the link-cut liveness test (link set down mid-transfer);
#   3. the hostile-peer limits (rdmakit_tcp_tests, suite TcpHostileLimits)
#      with the listening side in A and the hand-made peers in B.
# Usage: netns_test.sh {conformance|linkcut|hostile} BINARY
# Needs root and iproute2; exits 77 (skipped) without them. The namespaces
# are private to this run (pid in the name) and removed on any exit.
set -u
mode=${1:?mode}
bin=${2:?binary}

if [[ $(id -u) -ne 0 ]] || ! command -v ip >/dev/null; then
  echo "skipped: needs root and iproute2"
  exit 77
fi

# Namespaces left by a run that was SIGKILLed (no trap runs then): their
# owner pid is in the name; remove those whose owner is gone.
for stale in $(ip netns list 2>/dev/null | grep -oE '^rktcp[0-9]+[ab]'); do
  owner=${stale#rktcp}
  owner=${owner%?}
  if ! kill -0 "$owner" 2>/dev/null; then ip netns del "$stale" 2>/dev/null; fi
done

tag="rktcp$$"
ns_a="${tag}a"
ns_b="${tag}b"
cleanup() {
  ip netns del "$ns_a" 2>/dev/null
  ip netns del "$ns_b" 2>/dev/null
  [[ -n "${server_pid:-}" ]] && kill "$server_pid" 2>/dev/null
  return 0
}
trap cleanup EXIT INT TERM

ip netns add "$ns_a" || exit 1
ip netns add "$ns_b" || exit 1
# The veth pair is created directly inside the namespaces: the host's own
# network is never touched.
ip link add "${tag}va" netns "$ns_a" type veth peer name "${tag}vb" netns "$ns_b" || exit 1
ip -n "$ns_a" addr add 10.200.0.1/24 dev "${tag}va"
ip -n "$ns_b" addr add 10.200.0.2/24 dev "${tag}vb"
for ns in "$ns_a" "$ns_b"; do ip -n "$ns" link set lo up; done
ip -n "$ns_a" link set "${tag}va" up
ip -n "$ns_b" link set "${tag}vb" up
if ! ip netns exec "$ns_b" ping -c 1 -W 2 10.200.0.1 >/dev/null 2>&1; then
  # Routes may need a moment after link up.
  sleep 1
fi

case "$mode" in
  conformance)
    # Fork mode: the server role enters namespace A, clients stay in B.
    ip netns exec "$ns_b" env RDMAKIT_TEST_PROVIDERS=tcp RDMAKIT_TEST_HOST=10.200.0.1 \
      RDMAKIT_TEST_SERVER_NETNS="$ns_a" timeout 600 "$bin"
    exit $?
    ;;
  linkcut)
    port=$((20000 + $$ % 20000))
    ip netns exec "$ns_a" timeout 120 "$bin" server "10.200.0.1:$port" &
    server_pid=$!
    ip netns exec "$ns_b" timeout 120 "$bin" client "10.200.0.1:$port" \
      "ip -n $ns_a link set ${tag}va down"
    client_rc=$?
    wait "$server_pid"
    server_rc=$?
    server_pid=
    echo "linkcut: client rc=$client_rc server rc=$server_rc"
    [[ $client_rc -eq 0 && $server_rc -eq 0 ]]
    exit $?
    ;;
  hostile)
    # The test's listener enters namespace A (setns, one thread); its raw
    # peers and genuine clients stay in B.
    ip netns exec "$ns_b" env RDMAKIT_TCP_SERVER_NETNS="$ns_a" \
      RDMAKIT_TCP_SERVER_HOST=10.200.0.1 timeout 120 "$bin" \
      --gtest_filter='TcpHostileLimits.*'
    exit $?
    ;;
  *)
    echo "unknown mode $mode" >&2
    exit 2
    ;;
esac
