// A function's signature from a module's own DWARF (libdw), for checking that
// a replacement takes and returns what the function it replaces does
// (`iprobe patch`).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "iprobe/elf/elf_file.h"

namespace iprobe::elf {

// "ret(arg, arg, ...)" of the function whose code starts at link-time
// address `entry`, with typedefs resolved to what they name, so that two
// builds spelling a type differently still compare equal; a member
// function's `this` is its first argument.  nullopt when the module has no
// DWARF describing that address.
std::optional<std::string> function_signature(const ElfFile& elf, std::uint64_t entry);

// One formal parameter (or the return value) as the x86-64 SysV ABI passes it.
struct ParameterInfo {
    std::string name;            // "" for the return value or an unnamed parameter
    std::string type;            // as function_signature() spells it
    int integer_register = -1;   // 0..5: rdi rsi rdx rcx r8 r9; -1: not in one (float, struct, 7th+)
    unsigned size = 0;           // bytes
    bool is_signed = false;      // signed integer or enum with a signed base
    bool is_integer = false;     // integer, bool, enum, char, pointer or reference
    bool is_char_pointer = false;
};

struct FunctionParameters {
    std::vector<ParameterInfo> parameters;  // in declaration order (`this` first)
    std::optional<ParameterInfo> returns;   // nullopt: void
};

// The parameters of the function whose code starts at `entry`, with the
// integer register each arrives in; nullopt without DWARF for it.
std::optional<FunctionParameters> function_parameters(const ElfFile& elf, std::uint64_t entry);

}  // namespace iprobe::elf
