#pragma once

#include <string>

#include "iprobe/probelist/probe_list.h"

namespace iprobe::probelist {

// The probes of a module, whichever way it was built.  `path` may be
//   - a probe list (FILE.probes),
//   - a coldpatched binary (its FILE.probes beside it), or
//   - a binary with an IPROBE_PL_SECTION section (LLVM flow), or
//   - any other x86-64 binary: its function symbols (symbol_probes.h).
// Throws Error(not_found / bad_input) saying what to do when there are none.
ProbeList load_probes(const std::string& path);

}  // namespace iprobe::probelist
