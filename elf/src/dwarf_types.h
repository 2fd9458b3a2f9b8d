// DWARF helpers shared by the readers of function signatures and values
// (libdw): names of types as C spells them, the subprogram at an address.
#pragma once

#include <dwarf.h>
#include <elfutils/libdw.h>

#include <cstdint>
#include <string>

namespace iprobe::elf {

constexpr int kMaxDepth = 24;  // DWARF from a file is input: no cycle may recurse forever

struct DwarfCloser {
    void operator()(Dwarf* d) const { dwarf_end(d); }
};

std::string die_name(Dwarf_Die* die);
bool type_of(Dwarf_Die* die, Dwarf_Die* out);
std::string type_name(Dwarf_Die* die, int depth);
// The type `die` refers to by DW_AT_type, or "void" when it names none.
std::string referred(Dwarf_Die* die, int depth);
// The subprogram whose code starts at `entry` (namespaces and classes nest them in C++).
bool find_function(Dwarf* dwarf, std::uint64_t entry, Dwarf_Die* function);

}  // namespace iprobe::elf
