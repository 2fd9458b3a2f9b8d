// The probe-list reader (iprobe/probelist/probe_list.h), fed any bytes as a file:
// it refuses them or yields a list that serializes back to itself.
#include "fuzz_input.h"
#include "iprobe/probelist/probe_list.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace iprobe;
    fuzz::refusal_allowed([&] {
        const probelist::ProbeList list = probelist::ProbeList::deserialize({data, size}, "fuzz input");
        const std::vector<std::uint8_t> again = list.serialize();
        const probelist::ProbeList reread = probelist::ProbeList::deserialize(again, "reserialized fuzz input");
        fuzz::require(reread.serialize() == again);
    });
    return 0;
}
