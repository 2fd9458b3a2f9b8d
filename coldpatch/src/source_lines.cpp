#include "source_lines.h"

#include <elfutils/libdw.h>

namespace iprobe {

SourceLines::SourceLines(const ElfFile& elf) {
    if (elf.section(".debug_info") || elf.section(".zdebug_info"))
        dwarf_ = dwarf_begin_elf(elf.native_handle(), DWARF_C_READ, nullptr);
}

SourceLines::~SourceLines() {
    if (dwarf_) dwarf_end(dwarf_);
}

namespace {

// The compilation unit covering `address`: by .debug_aranges when present,
// else by each unit's ranges (clang emits no aranges by default).
bool unit_at(Dwarf* dwarf, Dwarf_Addr address, Dwarf_Die* unit) {
    if (dwarf_addrdie(dwarf, address, unit) != nullptr) return true;
    Dwarf_Off offset = 0, next = 0;
    std::size_t header_size = 0;
    while (dwarf_nextcu(dwarf, offset, &next, &header_size, nullptr, nullptr, nullptr) == 0) {
        if (dwarf_offdie(dwarf, offset + header_size, unit) && dwarf_haspc(unit, address) == 1) return true;
        offset = next;
    }
    return false;
}

}  // namespace

std::optional<SourceLocation> SourceLines::at(std::uint64_t address) const {
    if (!dwarf_) return std::nullopt;
    Dwarf_Die unit;
    if (!unit_at(dwarf_, address, &unit)) return std::nullopt;
    Dwarf_Line* line = dwarf_getsrc_die(&unit, address);
    if (!line) return std::nullopt;
    const char* file = dwarf_linesrc(line, nullptr, nullptr);
    int number = 0;
    dwarf_lineno(line, &number);
    if (!file) return std::nullopt;
    return SourceLocation{file, static_cast<std::uint32_t>(number)};
}

}  // namespace iprobe
