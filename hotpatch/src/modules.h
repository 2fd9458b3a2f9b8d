// Modules (executable, shared libraries) mapped in a stopped target, with the
// build-id read from the target's own memory, so a probe list is matched to
// the code actually running, not to whatever file now sits at that path.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "process.h"

namespace iprobe::hotpatch {

struct RunningModule {
    std::string path;
    std::uint64_t base = 0;       // start of the mapping at file offset 0
    std::uint64_t load_bias = 0;  // runtime address - link-time vaddr
    std::uint64_t load_end = 0;   // runtime end of its last PT_LOAD segment
    std::uint64_t low = 0, high = 0;  // extent of its load image's mappings
    std::uint64_t text_low = 0, text_high = 0;  // its load image's executable mappings
    std::vector<std::uint8_t> build_id;
    // Link-time [start, end) of its executable PT_LOAD segments: where probe sites may lie.
    std::vector<std::pair<std::uint64_t, std::uint64_t>> code_segments;
    bool holds_code(std::uint64_t link_address, std::uint64_t size) const;
};

// Reads the target's memory, which may change under a running target:
// planning only; what is written is checked again once it is stopped.
std::vector<RunningModule> running_modules(const ProcessMemory& memory, const std::vector<Mapping>& maps);
const RunningModule* find_module_by_path(const std::vector<RunningModule>& modules, const std::string& path);

// Path of `path` as seen from inside the target's mount namespace.
std::string target_view(pid_t pid, const std::string& path);

}  // namespace iprobe::hotpatch
