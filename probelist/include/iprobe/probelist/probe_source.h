#pragma once

#include <string>

#include "iprobe/probelist/probe_list.h"

namespace iprobe::probelist {

// The probes of a module, whichever way it was built.  `path` may be
//   - a probe list (FILE.probes),
//   - a coldpatched binary (its FILE.probes beside it; its relocated entries
//     get their moved bytes and the refused functions from the binary), or
//   - a binary with an IPROBE_PL_SECTION section (LLVM flow).
// Throws Error(not_found / bad_input) saying what to do when there are none.
ProbeList load_probes(const std::string& path);

// load_probes(path), or for a binary that has none (nobody prepared it: no
// iprobe-cc), the list derived from its function symbols
// (symbol_probes.h), whose entries are relocated when enabled.  What
// `iprobe list` and `iprobe attach` read; fperf keeps load_probes (a
// program profiled through compiled-in hooks must not be probed twice).
ProbeList load_probes_or_symbols(const std::string& path);

}  // namespace iprobe::probelist
