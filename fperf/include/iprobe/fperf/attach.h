// fperf's only contact with hotpatch: route the selected functions' probes
// to the handler library's fperf_enter/fperf_exit, and take them away again.
// Kept in one small file so a change of the hotpatch API touches only it.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace iprobe::fperf {

struct ProbeRouting {
    pid_t pid = 0;
    std::vector<std::string> probe_sources;   // as iprobe::load_probes takes them
    std::vector<std::string> function_globs;  // empty = every function
    std::string handler_library;              // absolute path of libfperf-handler.so
};

struct RoutingResult {
    std::size_t probes_enabled = 0;
    bool handler_injected = false;
    std::uint64_t pause_us = 0;
};

// True when this build has hotpatch (else route_probes throws `unavailable`).
bool hotpatch_available();
// Libraries hotpatch would inject, to preload instead when fperf starts the
// program (it stops inside the dynamic loader, where injection is refused).
std::vector<std::string> libraries_to_preload();
RoutingResult route_probes(const ProbeRouting& routing);
// Disables the probes of `routing` (its globs select which); false when that
// failed (the target may be gone).  Never throws.
bool unroute_probes(const ProbeRouting& routing) noexcept;

} // namespace iprobe::fperf
