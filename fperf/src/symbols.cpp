#include "iprobe/fperf/symbols.h"

#include <elf.h>

#include <algorithm>

#include "iprobe/elf/demangle.h"
#include "iprobe/elf/elf_file.h"
#include "iprobe/support/error.h"

namespace iprobe::fperf {

namespace {

std::optional<elf::ElfFile> open_elf(const std::string& path) {
    try {
        return elf::ElfFile(path);
    } catch (const Error&) {
        return std::nullopt;
    }
}

}  // namespace

std::vector<FunctionSymbol> read_function_symbols(const std::string& path) {
    std::vector<FunctionSymbol> out;
    const auto file = open_elf(path);
    if (!file) return out;
    for (const auto& sym : file->symbols())
        if (sym.type == STT_FUNC && sym.defined() && sym.address != 0 && !sym.name.empty())
            out.push_back({sym.address, sym.size, elf::demangle(sym.name)});
    std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.address < b.address; });
    out.erase(std::unique(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.address == b.address; }),
              out.end());
    return out;
}

std::optional<std::uint64_t> first_load_vaddr(const std::string& path) {
    const auto file = open_elf(path);
    if (!file || file->load_segments().empty()) return std::nullopt;
    return file->first_load_vaddr();
}

const FunctionSymbol* find_symbol(const std::vector<FunctionSymbol>& symbols, std::uint64_t address) {
    auto it = std::upper_bound(symbols.begin(), symbols.end(), address,
                               [](std::uint64_t a, const FunctionSymbol& s) { return a < s.address; });
    if (it == symbols.begin()) return nullptr;
    --it;
    if (it->address == address || address < it->address + std::max<std::uint64_t>(it->size, 1)) return &*it;
    return nullptr;
}

}  // namespace iprobe::fperf
