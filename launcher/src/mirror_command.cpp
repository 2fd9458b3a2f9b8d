#include "mirror_command.h"

#include "iprobe/support/json.h"

namespace iprobe::launcher {

namespace {

// Production bound to a loopback address is reached over lo only; bound to
// any other (or to all, 0.0.0.0), over any interface, lo too for local clients.
std::string capture_interface(const std::string& production) {
    const std::string host = production.substr(0, production.rfind(':'));
    return host.rfind("127.", 0) == 0 || host == "localhost" ? "lo" : "any";
}

}  // namespace

MirrorCommand mirror_command(const DebugOptions& o, const std::string& tool,
                             const std::vector<std::string>& debug_addresses, int port, const std::string& divergence,
                             const std::string& join, const std::string& hook_socket) {
    MirrorCommand m;
    m.argv = {tool, "mirror"};
    if (o.capture) {
        m.capture = capture_interface(o.production) + ":" + std::to_string(port);
        m.argv.insert(m.argv.end(), {"--capture", m.capture, "--join", join.empty() ? "off" : join});
        if (!hook_socket.empty()) m.argv.insert(m.argv.end(), {"--hold", "--hook-socket", hook_socket});
    } else {
        m.argv.insert(m.argv.end(), {"--listen", o.listen, "--production", o.production});
    }
    for (const auto& address : debug_addresses) m.argv.insert(m.argv.end(), {"--debug", address});
    m.argv.insert(m.argv.end(), {"--stats", "127.0.0.1:0", "--ready-fd", "3"});
    if (!o.buffer.empty()) m.argv.insert(m.argv.end(), {"--buffer", o.buffer});
    if (divergence != "off") m.argv.insert(m.argv.end(), {"--divergence", divergence});
    if (!o.patches.empty()) m.argv.push_back("--every-difference");  // each reply the patch changed
    return m;
}

std::string mirror_summary(const DebugOptions& o, const MirrorCommand& m, const std::string& divergence,
                           const std::string& stats_url) {
    const std::string path = o.capture ? "production " + o.production + "'s traffic captured on " + m.capture +
                                             " (clients unchanged, nothing in their path)"
                                       : "clients -> " + o.listen + " -> production " + o.production;
    const std::string clones = o.clones > 1 ? "each of the " + std::to_string(o.clones) + " clones" : "the clone";
    return path + "; a copy of every stream goes to " + clones + "; divergence checking " +
           (divergence == "off" ? std::string("off") : "by " + divergence) + "; stats at " + stats_url;
}

void mirror_event_fields(JsonWriter& w, const DebugOptions& o, const MirrorCommand& m) {
    if (o.capture) w.field("capture", m.capture);
    else w.field("listen", o.listen);
    w.field("production", o.production);
}

}  // namespace iprobe::launcher
