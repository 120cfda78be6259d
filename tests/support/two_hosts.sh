# Sourced by tests: two hosts as network namespaces joined by a veth pair.
#   two_hosts_up NS_A NS_B PREFIX [EXTRA_B...]
#     NS_A gets PREFIX.1, NS_B PREFIX.2 and PREFIX.EXTRA_B for each extra
#     (all /24); defines in_a, in_b (run a command in a namespace) and
#     wait_listen_ns PORT (a TCP listener in NS_A, bounded wait).
#   two_hosts_down   deletes both namespaces (the caller's EXIT trap calls it).
# The caller defines fail(). Needs root.
two_hosts_up() {
  two_hosts_a=$1 two_hosts_b=$2
  local prefix=$3; shift 3
  ip netns add "$two_hosts_a" && ip netns add "$two_hosts_b" || fail "ip netns add failed"
  ip link add "va$$" netns "$two_hosts_a" type veth peer name "vb$$" netns "$two_hosts_b" ||
    fail "veth failed"
  ip -n "$two_hosts_a" addr add "$prefix.1/24" dev "va$$"
  ip -n "$two_hosts_b" addr add "$prefix.2/24" dev "vb$$"
  local extra
  for extra in "$@"; do ip -n "$two_hosts_b" addr add "$prefix.$extra/24" dev "vb$$"; done
  for n in "$two_hosts_a" "$two_hosts_b"; do ip -n "$n" link set lo up; done
  ip -n "$two_hosts_a" link set "va$$" up
  ip -n "$two_hosts_b" link set "vb$$" up
}
in_a() { ip netns exec "$two_hosts_a" "$@"; }
in_b() { ip netns exec "$two_hosts_b" "$@"; }
wait_listen_ns() {
  for _ in $(seq 400); do
    in_a ss -ltn "sport = :$1" | grep -q LISTEN && return 0
    sleep 0.05
  done
  fail "no server listening on port $1 in $two_hosts_a"
}
two_hosts_down() {
  [ -n "${two_hosts_a:-}" ] && ip netns del "$two_hosts_a" 2>/dev/null
  [ -n "${two_hosts_b:-}" ] && ip netns del "$two_hosts_b" 2>/dev/null
  return 0
}
