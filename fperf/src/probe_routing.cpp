// The probes fperf routes to its handler, chosen once from the lists it
// loaded (attach.h); what route_probes and unroute_probes hand to hotpatch.
#include "iprobe/fperf/attach.h"

namespace iprobe::fperf {

std::vector<RoutedProbes> ProbeRouting::select(
    const std::vector<std::pair<std::string, iprobe::probelist::ProbeList>>& sources, const std::vector<std::string>& globs) {
    iprobe::probelist::ProbeSelector selector;
    selector.function_globs = globs;
    selector.kinds = {iprobe::probelist::ProbeKind::entry, iprobe::probelist::ProbeKind::exit};
    std::vector<RoutedProbes> out;
    for (const auto& [source, list] : sources) {
        RoutedProbes r{source, std::make_shared<const iprobe::probelist::ProbeList>(list), {}};
        for (const iprobe::probelist::Probe* p : selector.select(*r.list)) r.probes.push_back(p->id);
        if (!r.probes.empty()) out.push_back(std::move(r));
    }
    return out;
}

ProbeRouting ProbeRouting::only(const std::set<std::string>& functions) const {
    ProbeRouting out{pid, {}, handler_library};
    for (const RoutedProbes& r : selections) {
        RoutedProbes narrowed{r.source, r.list, {}};
        for (std::uint32_t id : r.probes)
            if (id < r.list->probes.size() && functions.count(r.list->probes[id].function)) narrowed.probes.push_back(id);
        if (!narrowed.probes.empty()) out.selections.push_back(std::move(narrowed));
    }
    return out;
}

std::size_t ProbeRouting::size() const {
    std::size_t n = 0;
    for (const RoutedProbes& r : selections) n += r.probes.size();
    return n;
}

}  // namespace iprobe::fperf
