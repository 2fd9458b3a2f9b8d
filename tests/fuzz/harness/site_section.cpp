// The reader of the probe records the LLVM pass embeds in a binary
// (iprobe/probelist/site_section.h), fed any bytes as the ELF file.
#include "fuzz_input.h"
#include "iprobe/probelist/site_section.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace iprobe;
    const UniqueFd file = fuzz::memfd_holding(data, size);
    fuzz::refusal_allowed([&] {
        if (const auto list = probelist::read_site_section(fuzz::path_of(file))) (void)list->serialize();
    });
    return 0;
}
