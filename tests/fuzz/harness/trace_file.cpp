// The reader of `iprobe trace --output` files (iprobe/hotpatch/trace_file.h),
// which `iprobe trace --input FILE` converts: any file a user passes.
// Header, footer and probe table checked, the events read in bounded chunks.
#include "fuzz_input.h"
#include "iprobe/hotpatch/trace_file.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace iprobe;
    fuzz::refusal_allowed([&] {
        const UniqueFd fd = fuzz::memfd_holding(data, size);
        hotpatch::TraceFileReader file(fuzz::path_of(fd));
        std::size_t events = 0;
        while (file.next([&](const hotpatch::Event& e) { events += e.probe < file.probes().size(); })) {
        }
    });
    return 0;
}
