// The readers of a process's iprobe region over a region whose every byte
// the target chose: report's aggregates, the event stream and the drop
// counts (iprobe/hotpatch/trace_reader.h), and status's view of it
// (hotpatch::region_status).  Nothing may read outside the mapping, loop
// without end or allocate beyond what the region's size allows.
#include "fuzz_input.h"
#include "iprobe/hotpatch/hotpatch.h"
#include "iprobe/hotpatch/trace_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace iprobe;
    fuzz::refusal_allowed([&] {
        hotpatch::TraceReader reader(fuzz::memfd_holding(data, size, true), hotpatch::TraceReader::Access::stream);
        const auto sums = reader.sums();
        (void)reader.functions(sums, nullptr);
        std::size_t events = 0;
        reader.drain([&](const hotpatch::Event&) { events++; });
        (void)reader.drops_by_thread();
        (void)reader.dropped();
        (void)reader.lost_events();
        (void)reader.unmatched_exits();
    });
    fuzz::refusal_allowed([&] {
        const auto st = hotpatch::region_status(fuzz::memfd_holding(data, size, true));
        (void)st;
    });
    return 0;
}
