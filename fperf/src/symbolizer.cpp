#include "symbolizer.h"

#include <algorithm>
#include <cstring>

#include "iprobe/probelist/probe_source.h"
#include "iprobe/support/error.h"
#include "iprobe/support/glob.h"
#include "record_target.h"

namespace iprobe::fperf {

std::optional<iprobe::probelist::ProbeList> try_probe_list(const std::vector<std::string>& sources, const std::string& exe,
                                                bool required) {
    const std::string source = sources.empty() ? exe : sources.front();
    try {
        return iprobe::probelist::load_probes(source);
    } catch (const Error&) {
        if (required) throw;
        return std::nullopt;
    }
}

std::vector<NamedFunction> candidate_functions(const std::optional<iprobe::probelist::ProbeList>& probes, const std::string& exe,
                                               const std::vector<std::string>& globs) {
    std::vector<NamedFunction> out;
    auto wanted = [&](const std::string& name) {
        if (globs.empty()) return true;
        for (const auto& g : globs)
            if (iprobe::glob_match(g, name)) return true;
        return false;
    };
    if (probes) {
        std::map<std::uint64_t, std::string> seen;
        for (const auto& p : probes->probes) {
            if (p.kind != iprobe::probelist::ProbeKind::entry) continue;
            const std::string& name = p.demangled.empty() ? p.function : p.demangled;
            if (wanted(name) || wanted(p.function)) seen.emplace(p.function_address, name);
        }
        for (auto& [addr, name] : seen) out.push_back({addr, name});
        return out;
    }
    for (const auto& s : read_function_symbols(exe))
        if (wanted(s.name)) out.push_back({s.address, s.name});
    return out;
}

void learn_modules_from_handler(const fperf_shm_header& h, Symbolizer& symbolizer) {
    for (std::uint32_t i = 0; i < h.module_count && i < FPERF_MAX_MODULES; i++) {
        const auto& m = h.modules[i];
        symbolizer.add_module(m.start, m.end, m.bias, std::string(m.path, strnlen(m.path, sizeof m.path)));
    }
}

void learn_modules_from_maps(pid_t pid, Symbolizer& symbolizer) {
    std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> extent;
    for (const auto& m : file_mappings(pid)) {
        auto [it, fresh] = extent.emplace(m.path, std::make_pair(m.start, m.end));
        if (!fresh) {
            it->second.first = std::min(it->second.first, m.start);
            it->second.second = std::max(it->second.second, m.end);
        }
    }
    for (const auto& [path, range] : extent)
        if (const auto vaddr = first_load_vaddr(path))
            symbolizer.add_module(range.first, range.second, range.first - *vaddr, path);
}

}  // namespace iprobe::fperf
