// Names for the addresses the handler reports: the probe list's functions
// first, then each mapped module's symbol table.
#pragma once

#include <sys/types.h>

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "iprobe/formats/fperf_region.h"
#include "iprobe/fperf/symbols.h"
#include "iprobe/probelist/probe_list.h"

namespace iprobe::fperf {

struct NamedFunction {
    std::uint64_t link_address = 0;
    std::string name;
};

std::optional<iprobe::probelist::ProbeList> try_probe_list(const std::vector<std::string>& sources, const std::string& exe,
                                                bool required);

std::vector<NamedFunction> candidate_functions(const std::optional<iprobe::probelist::ProbeList>& probes, const std::string& exe,
                                               const std::vector<std::string>& globs);

class Symbolizer {
public:
    void add_known(std::uint64_t runtime_address, const std::string& name, const std::string& module) {
        known_[runtime_address] = {name, module};
    }
    void add_module(std::uint64_t start, std::uint64_t end, std::uint64_t bias, const std::string& path) {
        for (const auto& m : modules_)
            if (m.start == start && m.path == path) return;
        modules_.push_back({start, end, bias, path});
    }

    std::pair<std::string, std::string> name(std::uint64_t address) {
        if (const auto it = known_.find(address); it != known_.end()) return it->second;
        for (const auto& m : modules_) {
            if (address < m.start || address >= m.end) continue;
            auto& symbols = symbols_[m.path];
            if (!symbols) symbols = read_function_symbols(m.path);
            if (const auto* s = find_symbol(*symbols, address - m.bias)) return {s->name, m.path};
            return {hex(address), m.path};
        }
        return {hex(address), ""};
    }

private:
    static std::string hex(std::uint64_t a) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "0x%" PRIx64, a);
        return buf;
    }
    struct Module {
        std::uint64_t start, end, bias;
        std::string path;
    };
    std::map<std::uint64_t, std::pair<std::string, std::string>> known_;
    std::vector<Module> modules_;
    std::map<std::string, std::optional<std::vector<FunctionSymbol>>> symbols_;
};

void learn_modules_from_handler(const fperf_shm_header& h, Symbolizer& symbolizer);

void learn_modules_from_maps(pid_t pid, Symbolizer& symbolizer);

}  // namespace iprobe::fperf
