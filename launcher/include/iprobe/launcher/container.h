// Live clones of a running podman container: podman's own checkpoint
// (`container checkpoint --leave-running --export`) and restore (`container
// restore --import` under a new name), with iprobe's CRIU >= 4.2 put in
// front of the OCI runtime, so the production container keeps running and
// the clone is a container of its own, alone on a podman network of its own.
#pragma once

#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "iprobe/launcher/clone.h"

namespace iprobe::launcher {

struct ContainerCloneOptions {
    std::string container;  // production's container, name or ID
    std::string name;       // the clone's container name; default <container>-iprobe-clone
    std::function<void(const std::string&)> progress;  // one line per step, may be empty
    bool client_view = false;  // as CloneOptions::client_view
};

struct ContainerCloneResult {
    std::string name;       // the clone's container name
    std::string id;         // and ID
    std::string source;     // production's container
    std::string address;    // the clone's IP address on its podman network
    std::string network;    // that network, iprobe-NAME: the clone's alone, isolated from the others
    pid_t clone_pid = -1;   // the clone's main process, as the host sees it
    double freeze_ms = 0;   // production frozen (CRIU frozen_time)
    double freezing_ms = 0; // time CRIU took to stop it
    double checkpoint_ms = 0, restore_ms = 0, total_ms = 0;
    double client_seen_ms = -1;  // as CloneResult::client_seen_ms
    unsigned long long pages_written = 0;
    // What would have collided with production, and what the clone has
    // instead: each port production publishes is published by the clone on
    // a free loopback port ("6379/tcp" -> "127.0.0.1:41339"); each named
    // volume is a copy of its own, taken right after the checkpoint
    // (production's volume -> the clone's, iprobe-NAME-VOLUME).
    std::vector<std::pair<std::string, std::string>> ports;
    std::vector<std::pair<std::string, std::string>> volumes;
};

// Clones `options.container`.  Production keeps running throughout; on any
// failure nothing is left behind (no clone container, no checkpoint archive).
ContainerCloneResult clone_container(const ContainerCloneOptions& options);

// The host PID of a running container's main process; throws Error(not_found).
pid_t container_main_pid(const std::string& container);

// Whether NAME is a container clone made by clone_container.
bool is_container_clone(const std::string& name);

// A container clone's record (what clone_container returned); nullopt when
// there is none of that name.
std::optional<ContainerCloneResult> load_container_clone(const std::string& name);
// Whether podman runs the container `id`.
bool container_running(const std::string& id);
// Names of the container clones iprobe made.
std::vector<std::string> list_container_clones();

// Removes a container clone (and only one made by clone_container) and its
// network; returns what it removed.
std::vector<Removed> destroy_container_clone(const std::string& name);

}  // namespace iprobe::launcher
