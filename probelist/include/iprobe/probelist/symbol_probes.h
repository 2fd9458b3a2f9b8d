// The probe list of a binary nobody prepared (no iprobe-cc, no pads): one
// function-entry site per function symbol with a size (.symtab, or .dynsym
// when the binary is stripped), whose first instructions relocate/ can move
// into a trampoline; the others are listed in `refused` with the reason.
#pragma once

#include <string>

#include "iprobe/probelist/probe_list.h"

namespace iprobe::probelist {

// Flow IPROBE_FLOW_UNPREPARED.  Throws Error(bad_input) for a file that is
// not an x86-64 executable or library, and when it has no function symbol
// with a size at all (a fully stripped binary) saying so.
ProbeList probes_from_symbols(const std::string& path);

}  // namespace iprobe::probelist
