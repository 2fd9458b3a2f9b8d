// file:line of code addresses from a module's own DWARF (libdw).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "iprobe/elf/elf_file.h"

typedef struct Dwarf Dwarf;

namespace iprobe::elf {

struct SourceLocation {
    std::string file;
    std::uint32_t line = 0;
};

class SourceLines {
public:
    explicit SourceLines(const ElfFile& elf);  // no DWARF: every lookup is nullopt
    ~SourceLines();
    SourceLines(const SourceLines&) = delete;
    SourceLines& operator=(const SourceLines&) = delete;

    std::optional<SourceLocation> at(std::uint64_t address) const;

private:
    struct UnitRange {
        std::uint64_t low = 0, high = 0;
        std::uint64_t die = 0;  // Dwarf_Off of the unit's DIE
    };
    void index_units();

    Dwarf* dwarf_ = nullptr;
    std::vector<UnitRange> units_;  // sorted by low
};

}  // namespace iprobe::elf
