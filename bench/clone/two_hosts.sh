# Sourced by the bench/clone scripts: two_hosts A B VETH SUBNET makes network
# namespaces A and B (loopback up) joined by a veth pair VETH-a/VETH-b, with
# SUBNET.1/24 in A and SUBNET.2/24 in B: production's host and a second one.
# Deleting the namespaces removes the pair.
two_hosts() {
  local a=$1 b=$2 veth=$3 subnet=$4
  ip netns add "$a"; ip netns add "$b"
  ip -n "$a" link set lo up; ip -n "$b" link set lo up
  ip link add "$veth-a" type veth peer name "$veth-b"
  ip link set "$veth-a" netns "$a"; ip link set "$veth-b" netns "$b"
  ip -n "$a" addr add "$subnet.1/24" dev "$veth-a"; ip -n "$b" addr add "$subnet.2/24" dev "$veth-b"
  ip -n "$a" link set "$veth-a" up; ip -n "$b" link set "$veth-b" up
}
