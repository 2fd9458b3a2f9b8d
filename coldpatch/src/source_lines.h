// file:line of code addresses from the module's own DWARF (libdw).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "iprobe/coldpatch/elf_file.h"

typedef struct Dwarf Dwarf;

namespace iprobe {

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
    Dwarf* dwarf_ = nullptr;
};

}  // namespace iprobe
