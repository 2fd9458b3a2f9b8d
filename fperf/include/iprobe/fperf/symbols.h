// Function names for addresses: the module's ELF symbol tables (read with
// iprobe_elf) in the shape fperf's sampler looks them up.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace iprobe::fperf {

struct FunctionSymbol {
    std::uint64_t address = 0;  // link-time vaddr
    std::uint64_t size = 0;
    std::string name;           // demangled when it is C++
};

// FUNC symbols of .symtab and .dynsym, sorted by address, duplicates removed.
// Empty when the file cannot be read as ELF.
std::vector<FunctionSymbol> read_function_symbols(const std::string& path);

// The symbol at (or containing) a link-time address.
const FunctionSymbol* find_symbol(const std::vector<FunctionSymbol>& symbols, std::uint64_t address);

// Lowest p_vaddr of the PT_LOAD segments, rounded down to a page: what the
// module's lowest mapping corresponds to (load bias = mapping start - this).
std::optional<std::uint64_t> first_load_vaddr(const std::string& path);

} // namespace iprobe::fperf
