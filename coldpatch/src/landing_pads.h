#pragma once

#include <cstdint>
#include <vector>

#include "iprobe/elf/elf_file.h"

namespace iprobe::coldpatch {

// A call in [call_begin, call_end) that throws continues at landing_pad.
struct LandingEdge {
    std::uint64_t landing_pad;
    std::uint64_t call_begin;
    std::uint64_t call_end;
};

// Every exception edge described by the module's .eh_frame LSDAs; empty
// when there are none or they cannot be parsed.
std::vector<LandingEdge> landing_edges(const elf::ElfFile& elf);

}  // namespace iprobe::coldpatch
