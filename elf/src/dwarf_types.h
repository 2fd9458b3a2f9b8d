// DWARF helpers shared by the readers of function signatures and values
// (libdw): names of types as C spells them, the subprogram at an address.
#pragma once

#include <dwarf.h>
#include <elfutils/libdw.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

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
// A file's DWARF, opened once, and its subprograms by the addresses their
// code starts at (the lowest, or any range's: gcc's hot and cold parts),
// from one walk of every unit: looking up each of a program's functions
// costs a search, not a walk of its unit (of every unit when the aranges do
// not cover it: node 20, a static V8, has 71 000 functions and 111 units
// describing 3 824 of them, which took 311 s).
// ElfFile::function_dies() keeps one per file.
class FunctionDies {
public:
    explicit FunctionDies(Elf* elf);
    Dwarf* dwarf() const { return dwarf_.get(); }
    // The subprogram whose code starts at `entry` (namespaces and classes
    // nest them in C++); when several do, the one in the unit the aranges
    // give for `entry`, else the first.
    bool find(std::uint64_t entry, Dwarf_Die* function) const;
    // The subprogram of `unit` (the offset of its DIE) whose code holds
    // `pc`, the first in the unit (namespaces and classes nest them in C++;
    // not one in a lexical block): an inlined copy's host.
    bool host_at(Dwarf_Off unit, std::uint64_t pc, Dwarf_Die* host) const;

private:
    void index(Dwarf_Die* parent, Dwarf_Off unit, int depth, bool in_block);

    struct Start {
        std::uint64_t entry;
        Dwarf_Off unit;
        Dwarf_Die die;
    };
    struct Range {
        std::uint64_t low, high;
        Dwarf_Off unit;
        std::size_t order;  // of its subprogram in the walk
        Dwarf_Die die;
    };
    std::unique_ptr<Dwarf, DwarfCloser> dwarf_;
    std::vector<Start> starts_;  // by entry; in walk order among equals
    std::vector<Range> ranges_;  // by low: every range of every subprogram outside lexical blocks
    std::uint64_t widest_ = 0;   // the longest of ranges_: a range holding pc starts at most this far below it
    std::size_t subprograms_ = 0;
};

}  // namespace iprobe::elf
