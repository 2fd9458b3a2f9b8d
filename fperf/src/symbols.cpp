#include "iprobe/fperf/symbols.h"

#include <cxxabi.h>
#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>

#include <algorithm>
#include <cstdlib>
#include <memory>

#include "iprobe/support/fd.h"

namespace iprobe::fperf {

std::string demangle(const std::string& name) {
    if (name.rfind("_Z", 0) != 0) return name;
    int status = 0;
    std::unique_ptr<char, decltype(&std::free)> out(abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status),
                                                    &std::free);
    return status == 0 && out ? std::string(out.get()) : name;
}

std::vector<FunctionSymbol> read_function_symbols(const std::string& path) {
    std::vector<FunctionSymbol> out;
    if (elf_version(EV_CURRENT) == EV_NONE) return out;
    iprobe::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd) return out;
    std::unique_ptr<Elf, decltype(&elf_end)> elf(elf_begin(fd.get(), ELF_C_READ, nullptr), &elf_end);
    if (!elf || elf_kind(elf.get()) != ELF_K_ELF) return out;
    Elf_Scn* scn = nullptr;
    while ((scn = elf_nextscn(elf.get(), scn)) != nullptr) {
        GElf_Shdr shdr;
        if (!gelf_getshdr(scn, &shdr) || (shdr.sh_type != SHT_SYMTAB && shdr.sh_type != SHT_DYNSYM)) continue;
        Elf_Data* data = elf_getdata(scn, nullptr);
        if (!data || shdr.sh_entsize == 0) continue;
        const std::size_t count = shdr.sh_size / shdr.sh_entsize;
        for (std::size_t i = 0; i < count; i++) {
            GElf_Sym sym;
            if (!gelf_getsym(data, static_cast<int>(i), &sym)) continue;
            if (GELF_ST_TYPE(sym.st_info) != STT_FUNC || sym.st_value == 0 || sym.st_shndx == SHN_UNDEF) continue;
            const char* name = elf_strptr(elf.get(), shdr.sh_link, sym.st_name);
            if (!name || !*name) continue;
            out.push_back({sym.st_value, sym.st_size, demangle(name)});
        }
    }
    std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.address < b.address; });
    out.erase(std::unique(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.address == b.address; }),
              out.end());
    return out;
}

std::optional<std::uint64_t> first_load_vaddr(const std::string& path) {
    if (elf_version(EV_CURRENT) == EV_NONE) return std::nullopt;
    iprobe::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd) return std::nullopt;
    std::unique_ptr<Elf, decltype(&elf_end)> elf(elf_begin(fd.get(), ELF_C_READ, nullptr), &elf_end);
    std::size_t count = 0;
    if (!elf || elf_getphdrnum(elf.get(), &count) != 0) return std::nullopt;
    std::optional<std::uint64_t> lowest;
    for (std::size_t i = 0; i < count; i++) {
        GElf_Phdr ph;
        if (gelf_getphdr(elf.get(), static_cast<int>(i), &ph) && ph.p_type == PT_LOAD &&
            (!lowest || ph.p_vaddr < *lowest))
            lowest = ph.p_vaddr;
    }
    if (lowest) *lowest &= ~std::uint64_t{0xfff};
    return lowest;
}

const FunctionSymbol* find_symbol(const std::vector<FunctionSymbol>& symbols, std::uint64_t address) {
    auto it = std::upper_bound(symbols.begin(), symbols.end(), address,
                               [](std::uint64_t a, const FunctionSymbol& s) { return a < s.address; });
    if (it == symbols.begin()) return nullptr;
    --it;
    if (it->address == address || address < it->address + std::max<std::uint64_t>(it->size, 1)) return &*it;
    return nullptr;
}

} // namespace iprobe::fperf
