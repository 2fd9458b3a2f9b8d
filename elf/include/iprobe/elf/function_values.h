// A function's parameters and return value, typed from its module's DWARF
// (libdw), and where the SysV x86-64 calling convention puts them: the
// registers the runtime captures at entry and exit (`iprobe attach --args
// --retval`), which the attacher asks for and the reader types.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "iprobe/elf/elf_file.h"

namespace iprobe::elf {

enum class ValueClass { signed_int, unsigned_int, boolean, enumeration, pointer, string, floating, structure, other };

struct ValueType {
    std::string name;  // as C spells it ("int", "const char*", "enum color", "struct point")
    ValueClass cls = ValueClass::other;
    std::uint32_t size = 0;  // bytes
    std::vector<std::pair<std::int64_t, std::string>> enumerators;
    struct Member {
        std::string name;
        std::uint32_t offset = 0;
        std::shared_ptr<const ValueType> type;
    };
    std::vector<Member> members;  // structure
};

// One eightbyte of a value: integer register `reg` (rdi, rsi, rdx, rcx, r8,
// r9 for arguments; rax, rdx for a return) or vector register `reg` (xmm).
struct ValuePart {
    bool vector = false;
    std::uint8_t reg = 0;
};

// Where one eightbyte of a value is at an address inside the function (the
// -finstrument-functions flow's site, after the prologue), for the runtime
// to read there without DWARF (rt_layout.h, iprobe_rt_location).
struct SiteLocation {
    enum class Kind : std::uint8_t { reg, memory, value, constant };
    Kind kind = Kind::reg;
    std::uint8_t reg = 0;     // DWARF register number: 0-15 integer (7: rsp at the site), 17-32 xmm0-15
    std::uint8_t size = 8;    // memory: bytes read
    std::int64_t offset = 0;  // memory: at reg + offset; value: reg + offset; constant: the value
};

struct ValueSlot {
    std::string name;
    ValueType type;
    std::vector<ValuePart> parts;          // empty: not in registers (in memory: shown as such)
    std::optional<std::int64_t> constant;  // a parameter a gcc clone made a constant
    // With a site: one location per part; empty when the value is not there
    // in a form the runtime can read (optimized out, an entry value, pieces).
    std::vector<SiteLocation> at_site;
};

struct FunctionValues {
    std::vector<ValueSlot> params;
    std::optional<ValueSlot> ret;  // nullopt: void
    std::uint8_t gprs = 0, xmms = 0;  // argument registers the parameters use
    std::uint8_t strings = 0;         // bit i: integer argument register i holds a char*
    bool typed = false;               // from DWARF (else arg0..arg5 raw)
    // With a site: the parameters' locations there (ValueSlot::at_site) and
    // the address of the return-address slot (a value: the CFA - 8; an
    // inlined copy's is its host's, where a backtrace starts, never hooked).
    bool at_site = false;
    std::optional<SiteLocation> return_slot;
    // With a site in another function's code: the hook of an inlined copy
    // (a DW_TAG_inlined_subroutine there), whose parameters are read where
    // the copy keeps them; it has no return (no return value of its own).
    bool inlined = false;
    // With a site: the function's own code, [low, high) each (its cold part
    // too); a hook outside it is an inlined copy's.  `inlined`: the copy's
    // code (its exit hooks are the function's exit hooks in it).
    std::vector<std::pair<std::uint64_t, std::uint64_t>> code;
    // Within `code`, the copies of the function inlined into itself (gcc
    // inlines a recursive static inline function into itself): theirs.
    std::vector<std::pair<std::uint64_t, std::uint64_t>> own_copies;
    bool holds(std::uint64_t pc) const {
        auto in = [pc](const auto& ranges) {
            for (const auto& [low, high] : ranges)
                if (pc >= low && pc < high) return true;
            return false;
        };
        return in(code) && !in(own_copies);
    }
};

// The -finstrument-functions flow's site: an address inside the function
// and the file whose CFI (.eh_frame) covers it (the module; `dwarf_file`'s
// own .debug_frame is tried after it).
struct Site {
    std::uint64_t pc = 0;
    const ElfFile* cfi_file = nullptr;
};

// Of the function whose code starts at link-time address `entry`; nullopt
// when `dwarf_file` (the module, or its separate debug file) does not
// describe it.  `symbol` is the function's ELF symbol: a gcc clone
// ("f.isra.0", "f.constprop.0") passes no register for a parameter it
// dropped.
// With `site`, also where each parameter is at that address: in the
// function's own code, or in an inlined copy of it (`inlined`: the innermost
// DW_TAG_inlined_subroutine of the function holding the site, its parameters
// by DW_AT_abstract_origin); nullopt when the site is in neither.
std::optional<FunctionValues> function_values(const ElfFile& dwarf_file, std::uint64_t entry, const std::string& symbol,
                                              const std::optional<Site>& site = std::nullopt);

// The address of the return-address slot (CFA - 8, a value) at the site,
// from its CFI (the module's .eh_frame, else `dwarf_file`'s .debug_frame
// when given); nullopt when neither says, or not as rsp or rbp + offset.
std::optional<SiteLocation> return_slot_at(const Site& site, const ElfFile* dwarf_file);

// Without DWARF: arg0..arg5, raw 64-bit integers, and a 64-bit return in rax.
FunctionValues raw_function_values();

// The file holding `module`'s DWARF: itself when it has .debug_info, else
// /usr/lib/debug/.build-id/xx/yyyy.debug when present; nullopt otherwise.
std::optional<std::string> debug_file_for(const ElfFile& module);

}  // namespace iprobe::elf
