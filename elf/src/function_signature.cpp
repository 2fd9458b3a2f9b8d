#include "iprobe/elf/function_signature.h"

#include <memory>

#include "dwarf_types.h"

namespace iprobe::elf {

std::optional<std::string> function_signature(const ElfFile& elf, std::uint64_t entry) {
    const FunctionDies* dies = elf.function_dies();
    Dwarf_Die function;
    if (!dies || !dies->find(entry, &function)) return std::nullopt;
    std::string out = referred(&function, 0) + "(";
    Dwarf_Die param;
    bool first = true;
    if (dwarf_child(&function, &param) == 0) do {
            const int tag = dwarf_tag(&param);
            if (tag != DW_TAG_formal_parameter && tag != DW_TAG_unspecified_parameters) continue;
            out += first ? "" : ", ";
            out += tag == DW_TAG_unspecified_parameters ? "..." : referred(&param, 0);
            first = false;
        } while (dwarf_siblingof(&param, &param) == 0);
    return out + ")";
}

}  // namespace iprobe::elf
