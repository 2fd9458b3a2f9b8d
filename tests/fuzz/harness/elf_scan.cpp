// Coldpatch's ELF scanner (iprobe/coldpatch/coldpatch.h): the placeholder scan and
// the patchable-entry scan over any bytes that pass for an ELF file.
#include "fuzz_input.h"
#include "iprobe/coldpatch/coldpatch.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace iprobe;
    fuzz::refusal_allowed([&] {
        const elf::ElfFile elf(std::vector<std::uint8_t>(data, data + size), "fuzz input");
        if (!elf.is_x86_64()) return;
        fuzz::refusal_allowed([&] { (void)coldpatch::scan_placeholders(elf, "fuzz"); });
        (void)coldpatch::scan_patchable_entries(elf);
    });
    return 0;
}
