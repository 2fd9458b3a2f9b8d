// Internal: named network namespaces (the `ip netns` convention, so users
// can `ip netns exec`/`nsenter --net=/run/netns/NAME` into a clone) and the
// veth link that connects a clone to the host.
#pragma once

#include <string>
#include <vector>

namespace iprobe::launcher {

std::string netns_path_of(const std::string& name);  // /run/netns/NAME
// Creates NAME with loopback up unless it exists; true when created.
bool ensure_netns(const std::string& name);
void delete_netns(const std::string& name);
void delete_link(const std::string& ifname);  // in the current namespace; absent is fine
// A link of that name exists in the current network namespace (asked of the
// kernel: /sys/class/net shows the namespace sysfs was mounted in, which
// is not ours when the launcher runs in production's, as `nsenter --net`).
bool link_exists(const std::string& ifname);

// A veth pair: `host_if` with host_cidr here, its peer (named "eth0") with
// clone_cidr inside namespace `name`, both up.
void create_veth(const std::string& name, const std::string& host_if, const std::string& host_cidr,
                 const std::string& clone_cidr);

// The addresses of every interface of a network namespace (`ip -j addr
// show`'s JSON, read into this; `netns_path` empty: ours), in its order.
struct InterfaceAddress {
    std::string ifname;
    std::string family;  // "inet" or "inet6"
    std::string local;   // the address, without its prefix length
};
std::vector<InterfaceAddress> interface_addresses(const std::string& netns_path = {});

// Remembers the host end of a clone's veth so destroy removes it.
void record_clone_veth(const std::string& name, const std::string& veth);

}  // namespace iprobe::launcher
