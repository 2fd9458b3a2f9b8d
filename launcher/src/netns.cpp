#include "netns.h"

#include <net/if.h>
#include <unistd.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "iprobe/support/error.h"
#include "process.h"

namespace iprobe::launcher {

std::string netns_path_of(const std::string& name) { return "/run/netns/" + name; }

bool ensure_netns(const std::string& name) {
    if (std::filesystem::exists(netns_path_of(name))) return false;
    run_checked({"ip", "netns", "add", name}, "creating network namespace " + name);
    try {
        run_checked({"ip", "-n", name, "link", "set", "lo", "up"}, "bringing up loopback in " + name);
    } catch (...) {
        delete_netns(name);
        throw;
    }
    return true;
}

void delete_netns(const std::string& name) {
    if (std::filesystem::exists(netns_path_of(name))) run({"ip", "netns", "delete", name});
}

bool link_exists(const std::string& ifname) { return ::if_nametoindex(ifname.c_str()) != 0; }

void delete_link(const std::string& ifname) {
    if (link_exists(ifname)) run({"ip", "link", "delete", ifname});
}

void create_veth(const std::string& name, const std::string& host_if, const std::string& host_cidr,
                 const std::string& clone_cidr) {
    delete_link(host_if);
    const std::string peer = host_if + "p";
    run_checked({"ip", "link", "add", host_if, "type", "veth", "peer", "name", peer}, "creating veth " + host_if);
    try {
        test_pause("veth");
        run_checked({"ip", "link", "set", peer, "netns", name}, "moving veth into " + name);
        run_checked({"ip", "-n", name, "link", "set", peer, "name", "eth0"}, "renaming veth in " + name);
        run_checked({"ip", "-n", name, "addr", "add", clone_cidr, "dev", "eth0"}, "addressing the clone side");
        run_checked({"ip", "-n", name, "link", "set", "eth0", "up"}, "bringing up the clone side");
        run_checked({"ip", "addr", "add", host_cidr, "dev", host_if}, "addressing the host side");
        run_checked({"ip", "link", "set", host_if, "up"}, "bringing up the host side");
    } catch (...) {
        delete_link(host_if);
        throw;
    }
}

std::vector<InterfaceAddress> interface_addresses(const std::string& netns_path) {
    std::vector<std::string> argv = {"ip", "-j", "addr", "show"};
    if (!netns_path.empty()) argv.insert(argv.begin(), {"nsenter", "--net=" + netns_path});
    const auto links = nlohmann::json::parse(run(argv).out, nullptr, false);
    if (!links.is_array()) throw Error("`ip -j addr show` gave no interface list; is iproute2 installed?");
    std::vector<InterfaceAddress> out;
    for (const auto& link : links) {
        if (!link.is_object()) continue;
        const auto addresses = link.value("addr_info", nlohmann::json::array());
        if (!addresses.is_array()) continue;
        for (const auto& a : addresses)
            if (a.is_object())
                out.push_back({link.value("ifname", ""), a.value("family", ""), a.value("local", "")});
    }
    return out;
}

}  // namespace iprobe::launcher
