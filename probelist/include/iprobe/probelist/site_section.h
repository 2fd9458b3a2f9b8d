// Probe records a binary carries in its IPROBE_PL_SECTION section (emitted
// at compile time by the LLVM pass and by the IPROBE_POINT macros), so no
// disassembly or side file is needed.
#pragma once

#include <optional>
#include <string>

#include "iprobe/probelist/probe_list.h"

namespace iprobe::probelist {

// The module's probes from its section; nullopt when it has none.
std::optional<ProbeList> read_site_section(const std::string& elf_path);

}  // namespace iprobe::probelist
