// fperf's only contact with hotpatch: route the selected functions' probes
// to the handler library's fperf_enter/fperf_exit, and take them away again.
// Kept in one small file so a change of the hotpatch API touches only it.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "iprobe/probelist/probe_list.h"

namespace iprobe::fperf {

// The probes chosen once (fperf loaded their lists to name its functions):
// hotpatch neither reloads nor re-matches them.
struct RoutedProbes {
    std::string source;  // the list's path, as the target sees it
    std::shared_ptr<const iprobe::probelist::ProbeList> list;
    std::vector<std::uint32_t> probes;  // ids of entry and exit probes
};

struct ProbeRouting {
    pid_t pid = 0;
    std::vector<RoutedProbes> selections;
    std::string handler_library;  // absolute path of libfperf-handler.so

    // The entry and exit probes of `sources`' functions matching `globs`
    // (every function when empty).
    static std::vector<RoutedProbes> select(const std::vector<std::pair<std::string, iprobe::probelist::ProbeList>>& sources,
                                            const std::vector<std::string>& globs);
    // This routing narrowed to the functions named (raw symbols).
    ProbeRouting only(const std::set<std::string>& functions) const;
    std::size_t size() const;
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
// Disables the probes of `routing`; false when that
// failed (the target may be gone).  Never throws.
bool unroute_probes(const ProbeRouting& routing) noexcept;

} // namespace iprobe::fperf
