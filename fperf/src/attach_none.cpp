// Built when the hotpatch library is not part of this build.
#include "iprobe/fperf/attach.h"

#include "iprobe/support/error.h"

namespace iprobe::fperf {

bool hotpatch_available() { return false; }

std::vector<std::string> libraries_to_preload() { return {}; }

RoutingResult route_probes(const ProbeRouting&) {
    throw iprobe::Error("this fperf was built without hotpatch: it can only profile programs built with plain "
                        "-finstrument-functions, started by `fperf record -- PROGRAM`",
                        iprobe::ExitCode::unavailable);
}

bool unroute_probes(const ProbeRouting&) noexcept { return false; }

} // namespace iprobe::fperf
