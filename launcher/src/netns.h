// Internal: named network namespaces (the `ip netns` convention, so users
// can `ip netns exec`/`nsenter --net=/run/netns/NAME` into a clone) and the
// veth link that connects a clone to the host.
#pragma once

#include <string>

namespace iprobe::launcher {

std::string netns_path_of(const std::string& name);  // /run/netns/NAME
// Creates NAME with loopback up unless it exists; true when created.
bool ensure_netns(const std::string& name);
void delete_netns(const std::string& name);
void delete_link(const std::string& ifname);  // in the current namespace; absent is fine

// A veth pair: `host_if` with host_cidr here, its peer (named "eth0") with
// clone_cidr inside namespace `name`, both up.
void create_veth(const std::string& name, const std::string& host_if, const std::string& host_cidr,
                 const std::string& clone_cidr);

// Remembers the host end of a clone's veth so destroy removes it.
void record_clone_veth(const std::string& name, const std::string& veth);

}  // namespace iprobe::launcher
