// What podman says, read into typed structs (`podman container inspect`,
// `podman container checkpoint --print-stats`): only the fields iprobe
// reads, each optional one defaulted (podman omits empty ones).  Podman's
// JSON crosses into iprobe here and nowhere else (container.cpp).
#pragma once

#include <sys/types.h>

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace iprobe::launcher::podman {

struct PortBinding {
    std::string host_ip, host_port;
    bool operator==(const PortBinding&) const = default;
};

struct Mount {
    std::string type, name, source, destination;  // type: "volume", "bind", ...
    bool rw = false;
    bool operator==(const Mount&) const = default;
};

struct NetworkAttachment {
    std::string ip_address;
    bool operator==(const NetworkAttachment&) const = default;
};

// One element of `podman container inspect`.
struct Container {
    std::string id;
    bool running = false;
    pid_t pid = 0;
    std::map<std::string, std::vector<PortBinding>> port_bindings;  // HostConfig: what it asked for
    std::vector<Mount> mounts;
    std::map<std::string, NetworkAttachment> networks;
    std::map<std::string, std::vector<PortBinding>> ports;  // NetworkSettings: what it got
    std::string static_dir;       // StaticDir: its directory in podman's storage ("userdata")
    std::string checkpoint_path;  // State.CheckpointPath: where a checkpoint's CRIU images went ("" before one)
};

// CRIU's statistics as podman passes them on.
struct CheckpointStats {
    double frozen_us = 0, freezing_us = 0, pages_written = 0;
};

// The first container of `podman container inspect`'s array; nullopt when
// there is none (an empty array, or no array).  Throws Error(bad_input) when
// it is not JSON or a container lacks its Id or State.
std::optional<Container> parse_inspect(std::string_view json);
// The last container's statistics in `podman container checkpoint
// --print-stats` output.  Throws Error(bad_input) on anything else.
CheckpointStats parse_checkpoint_stats(std::string_view json);

}  // namespace iprobe::launcher::podman
