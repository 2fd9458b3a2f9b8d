// Probes from function symbols, for code without pads: one function-entry
// site per function symbol with a size (.symtab, or .dynsym when the binary
// is stripped), whose first instructions relocate/ can move into a
// trampoline; the others are refused with the reason.  The whole list of a
// binary nobody prepared (no iprobe-cc), and the entry flow's functions
// the gcc plugin left without a pad (small functions).
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "iprobe/elf/elf_file.h"
#include "iprobe/probelist/probe_list.h"
#include "iprobe/support/error.h"

namespace iprobe::probelist {

struct RelocatedEntries {
    std::vector<Probe> probes;             // entry (relocated, `moved` filled) and exit, per function, by address
    std::vector<RefusedFunction> refused;  // by address
    bool any_line = false;                 // some probe has a source line (DWARF)
};

// The functions of `elf` (all, or those starting at an address in `only`).
// Cold parts gcc split off (foo.cold: entered by a jump, no return address
// on the stack) are refused.
RelocatedEntries relocated_entries(const elf::ElfFile& elf, const std::set<std::uint64_t>* only = nullptr);

// The functions the gcc plugin left without a pad (small functions), by the
// label it puts at their first instruction (IPROBE_UNPADDED_MARKER).
std::set<std::uint64_t> marked_unpadded(const elf::ElfFile& elf);

// A binary with no probe list and no function symbol with a size at all
// (fully stripped): nothing to probe in it.
class NoFunctionSymbols : public Error {
public:
    using Error::Error;
};

// Flow IPROBE_FLOW_UNPREPARED.  Throws Error(bad_input) for a file that is
// not an x86-64 executable or library, and NoFunctionSymbols (bad_input)
// when it has no function symbol with a size at all, saying so.
ProbeList probes_from_symbols(const std::string& path);

// A list with relocated entries read from a binary's side list gets what the file does
// not store: its relocated entries' `moved` bytes and the refused functions,
// planned again from `binary` (the same plan coldpatch made at link time).
// Nothing when its relocated entries have their bytes already.
void add_relocation_plans(ProbeList& list, const std::string& binary);

}  // namespace iprobe::probelist
