#include "iprobe/elf/source_lines.h"

#include <elfutils/libdw.h>

#include <algorithm>

namespace iprobe::elf {

SourceLines::SourceLines(const ElfFile& elf) {
    if (elf.section(".debug_info") || elf.section(".zdebug_info"))
        dwarf_ = dwarf_begin_elf(elf.native_handle(), DWARF_C_READ, nullptr);
    if (dwarf_) index_units();
}

SourceLines::~SourceLines() {
    if (dwarf_) dwarf_end(dwarf_);
}

// clang emits no .debug_aranges by default, and walking every unit per lookup
// is quadratic on a large program: the units' ranges are indexed once.
void SourceLines::index_units() {
    Dwarf_Off offset = 0, next = 0;
    std::size_t header_size = 0;
    while (dwarf_nextcu(dwarf_, offset, &next, &header_size, nullptr, nullptr, nullptr) == 0) {
        Dwarf_Die unit;
        if (dwarf_offdie(dwarf_, offset + header_size, &unit)) {
            Dwarf_Addr base = 0, low = 0, high = 0;
            std::ptrdiff_t cursor = 0;
            while ((cursor = dwarf_ranges(&unit, cursor, &base, &low, &high)) > 0)
                if (high > low) units_.push_back({low, high, offset + header_size});
        }
        offset = next;
    }
    std::sort(units_.begin(), units_.end(), [](const UnitRange& a, const UnitRange& b) { return a.low < b.low; });
}

std::optional<SourceLocation> SourceLines::at(std::uint64_t address) const {
    if (!dwarf_) return std::nullopt;
    Dwarf_Die unit;
    bool found = false;
    auto it = std::upper_bound(units_.begin(), units_.end(), address,
                               [](std::uint64_t a, const UnitRange& r) { return a < r.low; });
    // Units rarely overlap; look back a little for one that does.
    for (int step = 0; step < 64 && it != units_.begin() && !found; ++step) {
        --it;
        if (address < it->high) found = dwarf_offdie(dwarf_, it->die, &unit) != nullptr;
    }
    if (!found && dwarf_addrdie(dwarf_, address, &unit) == nullptr) return std::nullopt;
    Dwarf_Line* line = dwarf_getsrc_die(&unit, address);
    if (!line) return std::nullopt;
    const char* file = dwarf_linesrc(line, nullptr, nullptr);
    int number = 0;
    if (!file || dwarf_lineno(line, &number) != 0) return std::nullopt;
    return SourceLocation{file, static_cast<std::uint32_t>(number)};
}

}  // namespace iprobe::elf
