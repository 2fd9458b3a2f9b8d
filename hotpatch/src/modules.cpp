#include "modules.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <set>

#include "iprobe/elf/loaded_image.h"

namespace iprobe::hotpatch {

namespace {

// ELF header, program headers and notes as loaded in the target.
bool inspect_image(const ProcessMemory& process, RunningModule& module) {
    const auto image = elf::read_loaded_image(
        module.base, [&](std::uint64_t address, void* out, std::size_t size) { process.read(address, out, size); });
    if (!image) return false;
    module.load_bias = module.base - image->first_load_vaddr;
    module.load_end = module.load_bias + image->load_end_vaddr;
    module.code_segments = image->code_segments;
    module.build_id = image->build_id;
    return true;
}

// The module's extent and executable extent from the mappings of its load
// image alone: a program may map its own file again elsewhere (node: V8
// remaps its embedded builtins next to its code range, terabytes away),
// which is no place of the module's sites nor a measure of their reach.
void measure_extent(RunningModule& module, const std::vector<Mapping>& maps) {
    module.low = module.high = module.base;
    for (const auto& m : maps) {
        if (m.path != module.path || m.start < module.base || m.start >= module.load_end) continue;
        module.high = std::max(module.high, m.end);
        if (m.executable()) {
            if (module.text_low == 0 || m.start < module.text_low) module.text_low = m.start;
            module.text_high = std::max(module.text_high, m.end);
        }
    }
}

}  // namespace

std::vector<RunningModule> running_modules(const ProcessMemory& process, const std::vector<Mapping>& maps) {
    // Each file mapped with code somewhere: its image's base (the mapping at
    // offset 0); its extent is measured from that image once it is read.
    std::map<std::string, RunningModule> by_path;
    std::set<std::string> with_code;
    for (const auto& m : maps) {
        if (m.path.empty() || m.path[0] != '/') continue;
        auto& module = by_path[m.path];
        module.path = m.path;
        if (m.offset == 0 && module.base == 0) module.base = m.start;
        if (m.executable()) with_code.insert(m.path);
    }
    std::vector<RunningModule> modules;
    for (auto& [path, module] : by_path) {
        if (module.base == 0 || !with_code.contains(path) || !inspect_image(process, module)) continue;
        measure_extent(module, maps);
        if (module.text_low != 0) modules.push_back(std::move(module));
    }
    return modules;
}

bool RunningModule::holds_code(std::uint64_t link_address, std::uint64_t size) const {
    return std::any_of(code_segments.begin(), code_segments.end(), [&](const auto& s) {
        return link_address >= s.first && link_address < s.second && size <= s.second - link_address;
    });
}

const RunningModule* find_module_by_path(const std::vector<RunningModule>& modules, const std::string& path) {
    for (const auto& m : modules)
        if (m.path == path) return &m;
    return nullptr;
}

std::string target_view(pid_t pid, const std::string& path) {
    return "/proc/" + std::to_string(pid) + "/root" + path;
}

}  // namespace iprobe::hotpatch
