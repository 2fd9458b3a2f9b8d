// Podman's JSON read into typed structs (podman_json.h).
#include "iprobe/launcher/podman_json.h"

#include <nlohmann/json.hpp>

#include "iprobe/support/error.h"

namespace iprobe::launcher::podman {

using Json = nlohmann::json;

void from_json(const Json& j, PortBinding& b) {
    b.host_ip = j.value("HostIp", "");
    b.host_port = j.value("HostPort", "");
}

void from_json(const Json& j, Mount& m) {
    m.type = j.value("Type", "");
    m.name = j.value("Name", "");
    m.source = j.value("Source", "");
    m.destination = j.value("Destination", "");
    m.rw = j.value("RW", false);
}

void from_json(const Json& j, NetworkAttachment& n) { n.ip_address = j.value("IPAddress", ""); }

void from_json(const Json& j, Container& c) {
    c.id = j.at("Id").get<std::string>();
    const Json& state = j.at("State");
    c.running = state.value("Running", false);
    c.pid = state.value("Pid", 0);
    const auto map_of_bindings = [](const Json& ports) {
        std::map<std::string, std::vector<PortBinding>> out;
        if (!ports.is_object()) return out;
        for (const auto& [port, bindings] : ports.items())
            out[port] = bindings.is_array() ? bindings.get<std::vector<PortBinding>>() : std::vector<PortBinding>{};
        return out;
    };
    c.port_bindings = map_of_bindings(j.value("HostConfig", Json::object()).value("PortBindings", Json::object()));
    if (const Json mounts = j.value("Mounts", Json::array()); mounts.is_array()) c.mounts = mounts.get<std::vector<Mount>>();
    const Json net = j.value("NetworkSettings", Json::object());
    if (const Json networks = net.value("Networks", Json::object()); networks.is_object())
        c.networks = networks.get<std::map<std::string, NetworkAttachment>>();
    c.ports = map_of_bindings(net.value("Ports", Json::object()));
    c.static_dir = j.value("StaticDir", "");
    c.checkpoint_path = state.value("CheckpointPath", "");
}

void from_json(const Json& j, CheckpointStats& st) {
    st.frozen_us = j.value("frozen_time", 0.0);
    st.freezing_us = j.value("freezing_time", 0.0);
    st.pages_written = j.value("pages_written", 0.0);
}

std::optional<Container> parse_inspect(std::string_view json) {
    try {
        const Json doc = Json::parse(json);
        if (!doc.is_array() || doc.empty()) return std::nullopt;  // no such container
        return doc.at(0).get<Container>();
    } catch (const Json::exception& e) {
        throw Error(e.what(), ExitCode::bad_input);
    }
}

CheckpointStats parse_checkpoint_stats(std::string_view json) {
    try {
        const Json doc = Json::parse(json);
        CheckpointStats st;
        for (const auto& c : doc.at("container_statistics"))
            st = c.value("criu_statistics", Json::object()).get<CheckpointStats>();
        return st;
    } catch (const Json::exception& e) {
        throw Error(e.what(), ExitCode::bad_input);
    }
}

}  // namespace iprobe::launcher::podman
