// The `iprobe mirror` a debug session runs: a proxy clients are pointed at
// (--listen), or a passive capture of production's port (--capture), which
// needs no client to change anything.
#pragma once

#include <string>
#include <vector>

#include "iprobe/launcher/debug.h"

namespace iprobe {
class JsonWriter;
}

namespace iprobe::launcher {

struct MirrorCommand {
    std::vector<std::string> argv;  // the tool's arguments, tool first
    std::string capture;            // capture mode: "IFACE:PORT"
};

// `debug_addresses`: the clones, one --debug each; `port`: production's;
// `join`: its protocol (resp, http) when known, for joining connections
// already open.
// `hook_socket` (capture): the mirror holds every connection back from the
// clone until it is released, the CRIU hook marking the checkpoint there.
MirrorCommand mirror_command(const DebugOptions& o, const std::string& tool,
                             const std::vector<std::string>& debug_addresses, int port, const std::string& divergence,
                             const std::string& join, const std::string& hook_socket = {});

// How the session announces the mirror: a line for people, fields for --json.
std::string mirror_summary(const DebugOptions& o, const MirrorCommand& m, const std::string& divergence,
                           const std::string& stats_url);
void mirror_event_fields(JsonWriter& w, const DebugOptions& o, const MirrorCommand& m);

}  // namespace iprobe::launcher
