// A function's signature from a module's own DWARF (libdw), for checking that
// a replacement takes and returns what the function it replaces does
// (`iprobe patch`).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "iprobe/elf/elf_file.h"

namespace iprobe::elf {

// "ret(arg, arg, ...)" of the function whose code starts at link-time
// address `entry`, with typedefs resolved to what they name, so that two
// builds spelling a type differently still compare equal; a member
// function's `this` is its first argument.  nullopt when the module has no
// DWARF describing that address.
std::optional<std::string> function_signature(const ElfFile& elf, std::uint64_t entry);

}  // namespace iprobe::elf
