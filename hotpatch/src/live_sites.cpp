#include "live_sites.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "entry_sites.h"
#include "iprobe/support/error.h"

namespace iprobe::hotpatch {

namespace {

std::string region_string(const char* field, std::size_t size) { return std::string(field, ::strnlen(field, size)); }

const RunningModule* mapped_module(const iprobe_rt_module& m, const std::vector<RunningModule>& running) {
    const std::size_t id_size = std::min<std::size_t>(m.build_id_size, sizeof m.build_id);
    const std::vector<std::uint8_t> id(m.build_id, m.build_id + id_size);
    for (const auto& r : running)
        if (!r.build_id.empty() && r.build_id == id) return &r;
    return find_module_by_path(running, region_string(m.path, sizeof m.path));
}

std::optional<probelist::ProbeList> list_of(pid_t pid, const RunningModule& running, const iprobe_rt_module& m) {
    auto describes_it = [&](const std::optional<probelist::ProbeList>& list) {
        return list && !running.build_id.empty() && list->build_id == running.build_id;
    };
    if (auto beside = probe_list_at(target_view(pid, running.path)); describes_it(beside)) return beside;
    if (auto recorded = module_probe_list(m); describes_it(recorded)) return recorded;
    return std::nullopt;
}

}  // namespace

namespace {

AttachedModule with_sites(std::uint32_t region_index, const RunningModule& running, probelist::ProbeList list) {
    AttachedModule a{region_index, running, std::move(list), {}};
    a.sites.reserve(a.list.probes.size());
    for (const probelist::Probe& p : a.list.probes)
        a.sites.push_back(a.running.holds_code(p.site, p.size) ? a.running.load_bias + p.site : 0);
    return a;
}

}  // namespace

std::vector<AttachedModule> probed_modules(pid_t pid, const Region* region, const ProcessMemory& memory,
                                           const std::vector<iprobe_rt_module>& inherited) {
    const std::vector<RunningModule> running = running_modules(memory, read_maps(pid));
    std::vector<AttachedModule> out;
    auto known = [&](const RunningModule& r) {
        return std::any_of(out.begin(), out.end(), [&](const AttachedModule& a) { return a.running.path == r.path; });
    };
    for (const RunningModule& r : running) {
        if (r.build_id.empty()) continue;
        // Relocated entries of modules nobody prepared are found through the
        // region below: deriving every loaded library's list here would
        // sweep all of libc's code at each detach.
        auto beside = prepared_probe_list_at(target_view(pid, r.path));
        if (beside && beside->build_id == r.build_id) out.push_back(with_sites(kNotInRegion, r, std::move(*beside)));
    }
    // A list recorded elsewhere (attach --probes DIR/LIST): only as
    // module_probe_list() allows; a module the region names wrongly, or
    // twice, is passed over.
    for (std::uint32_t i = 0; region && i < region->module_count(); i++) {
        const iprobe_rt_module m = region->modules()[i];
        const RunningModule* mapped = mapped_module(m, running);
        if (!mapped) continue;
        if (known(*mapped)) {
            for (auto& a : out)  // its flags in the region, cleared as the sites go
                if (a.running.path == mapped->path && a.region_index == kNotInRegion) a.region_index = i;
            continue;
        }
        if (auto list = list_of(pid, *mapped, m)) out.push_back(with_sites(i, *mapped, std::move(*list)));
    }
    for (const iprobe_rt_module& m : inherited) {
        const RunningModule* mapped = mapped_module(m, running);
        if (!mapped || known(*mapped)) continue;
        if (auto list = list_of(pid, *mapped, m)) out.push_back(with_sites(kNotInRegion, *mapped, std::move(*list)));
    }
    return out;
}

std::vector<AttachedModule> attached_modules(pid_t pid, const Region& region, const ProcessMemory& memory) {
    const std::vector<RunningModule> running = running_modules(memory, read_maps(pid));
    std::vector<AttachedModule> out;
    for (std::uint32_t i = 0; i < region.module_count(); i++) {
        const iprobe_rt_module m = region.modules()[i];
        const RunningModule* mapped = mapped_module(m, running);
        if (!mapped) continue;  // unloaded since: its sites are gone with it
        auto list = list_of(pid, *mapped, m);
        if (!list)
            throw Error("cannot find the probe list of " + mapped->path + " in process " + std::to_string(pid) +
                            " (beside it, or at " + region_string(m.probes_path, sizeof m.probes_path) +
                            "): moved, replaced or of another build; nothing was changed",
                        ExitCode::not_found);
        out.push_back(with_sites(i, *mapped, std::move(*list)));
    }
    return out;
}

SiteState site_state(const probelist::Probe& probe, std::uint64_t address, const SiteText& text, StubChecker& stubs) {
    if (address == 0) return SiteState::absent;
    if (std::memcmp(text.data(), probe.placeholder.data(), probe.size) == 0) return SiteState::placeholder;
    if (stubs.calls_a_stub(address, text.data(), probe.size)) return SiteState::live;
    return SiteState::other;
}

std::vector<SiteState> site_states(const AttachedModule& module, const ProcessMemory& memory, StubChecker& stubs) {
    std::vector<std::uint64_t> addresses;
    std::vector<std::size_t> index;
    for (std::size_t k = 0; k < module.sites.size(); k++)
        if (module.sites[k]) addresses.push_back(module.sites[k]), index.push_back(k);
    const std::vector<SiteText> text = read_sites(memory, addresses);
    std::vector<SiteState> out(module.sites.size(), SiteState::absent);
    for (std::size_t j = 0; j < index.size(); j++) {
        const std::size_t k = index[j];
        out[k] = site_state(module.list.probes[k], module.sites[k], text[j], stubs);
        // A function-entry site serves its entry and its exit probe: which
        // of them is on is the stub it calls (entry_sites.h).
        if (j > 0 && index[j - 1] == k - 1 && probelist::serves_returns(module.list.probes, k - 1) &&
            out[k] == SiteState::live) {
            const auto variant = variant_at(called_stub(module.sites[k], text[j].data(), module.list.probes[k].size),
                                            static_cast<std::uint32_t>(k - 1));
            const EntryVariant v = variant.value_or(EntryVariant{true, false});
            out[k - 1] = v.enter ? SiteState::live : SiteState::placeholder;
            out[k] = v.exit ? SiteState::live : SiteState::placeholder;
        }
    }
    return out;
}

}  // namespace iprobe::hotpatch
