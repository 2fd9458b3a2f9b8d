#include "iprobe/fperf/attach.h"

#include "iprobe/hotpatch/hotpatch.h"
#include "iprobe/probelist/probe_list.h"

namespace iprobe::fperf {

namespace {

std::vector<iprobe::hotpatch::ProbeSelection> selections_of(const ProbeRouting& routing) {
    std::vector<iprobe::hotpatch::ProbeSelection> out;
    for (const RoutedProbes& r : routing.selections) out.push_back({r.source, r.list, r.probes});
    return out;
}

}  // namespace

bool hotpatch_available() { return true; }

std::vector<std::string> libraries_to_preload() { return {iprobe::hotpatch::default_runtime_library()}; }

RoutingResult route_probes(const ProbeRouting& routing) {
    iprobe::hotpatch::AttachOptions options;
    options.pid = routing.pid;
    options.selections = selections_of(routing);
    options.handlers.library = routing.handler_library;
    options.handlers.enter = "fperf_enter";
    options.handlers.exit = "fperf_exit";
    options.handlers.enter_nop = "fperf_enter_nop";  // the LLVM flow's sites
    options.handlers.exit_nop = "fperf_exit_nop";
    // Function-entry sites (the entry and LLVM flows): exits through the
    // runtime's return trampolines; fperf always takes both.
    options.handlers.entry_enter = "fperf_entry_enter";
    options.handlers.entry_enter_return = "fperf_entry_enter_return";
    const auto stats = iprobe::hotpatch::attach(options);
    return {stats.total_enabled, stats.handler_injected, stats.pause_us};
}

bool unroute_probes(const ProbeRouting& routing) noexcept {
    try {
        iprobe::hotpatch::DetachOptions options;
        options.pid = routing.pid;
        options.selections = selections_of(routing);
        if (options.selections.empty()) return true;  // nothing routed (an empty selection would be every probe)
        iprobe::hotpatch::detach(options);
        return true;
    } catch (...) {
        // The target exited or was never patched: nothing left to undo.
        return false;
    }
}

} // namespace iprobe::fperf
