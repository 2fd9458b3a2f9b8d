// The probe list of a binary nobody prepared (probelist/symbol_probes.h): its
// symbols, the relocation planner's sweep over all its code and jump tables
// (relocate/), and the trampoline of every entry it accepts, over any bytes
// that pass for an ELF file.
#include "fuzz_input.h"
#include "iprobe/probelist/symbol_probes.h"
#include "iprobe/relocate/entry_relocation.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace iprobe;
    const UniqueFd file = fuzz::memfd_holding(data, size);
    fuzz::refusal_allowed([&] {
        const probelist::ProbeList list = probelist::probes_from_symbols(fuzz::path_of(file));
        for (const probelist::Probe& p : list.probes)
            if (!p.moved.empty())
                fuzz::refusal_allowed([&] { (void)relocate::trampoline(p.moved, p.site, p.site + 0x100000); });
    });
    return 0;
}
