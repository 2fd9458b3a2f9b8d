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

struct ValueSlot {
    std::string name;
    ValueType type;
    std::vector<ValuePart> parts;          // empty: not in registers (in memory: shown as such)
    std::optional<std::int64_t> constant;  // a parameter a gcc clone made a constant
};

struct FunctionValues {
    std::vector<ValueSlot> params;
    std::optional<ValueSlot> ret;  // nullopt: void
    std::uint8_t gprs = 0, xmms = 0;  // argument registers the parameters use
    std::uint8_t strings = 0;         // bit i: integer argument register i holds a char*
    bool typed = false;               // from DWARF (else arg0..arg5 raw)
};

// Of the function whose code starts at link-time address `entry`; nullopt
// when `dwarf_file` (the module, or its separate debug file) does not
// describe it.  `symbol` is the function's ELF symbol: a gcc clone
// ("f.isra.0", "f.constprop.0") passes no register for a parameter it
// dropped.
std::optional<FunctionValues> function_values(const ElfFile& dwarf_file, std::uint64_t entry, const std::string& symbol);

// Without DWARF: arg0..arg5, raw 64-bit integers, and a 64-bit return in rax.
FunctionValues raw_function_values();

// The file holding `module`'s DWARF: itself when it has .debug_info, else
// /usr/lib/debug/.build-id/xx/yyyy.debug when present; nullopt otherwise.
std::optional<std::string> debug_file_for(const ElfFile& module);

}  // namespace iprobe::elf
