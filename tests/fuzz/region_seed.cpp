// Writes the region harness's seed: a compact but complete region (one
// module, four probes, one thread with sums and an exit mark of a detach,
// one ring holding an entry, a point with arguments and an exit), laid out as tightly as the reader's
// checks allow so the fuzzer spends its time on contents, not on pages.
//   fuzz_region_seed > tests/fuzz/corpus/region/compact
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "iprobe/formats/rt_layout.h"

namespace {

std::uint64_t align8(std::uint64_t v) { return (v + 7) & ~std::uint64_t{7}; }

template <typename T>
T* at(std::vector<std::uint8_t>& region, std::uint64_t offset) {
    return reinterpret_cast<T*>(region.data() + offset);
}

}  // namespace

int main() {
    constexpr std::uint32_t kProbes = 4, kRecords = 8;
    iprobe_rt_control cb{};
    std::memcpy(cb.magic, IPROBE_RT_MAGIC, 8);
    cb.version = IPROBE_RT_VERSION;
    cb.header_size = sizeof cb;
    cb.tsc_hz = 1000000000;
    cb.clock = IPROBE_RT_CLOCK_MONOTONIC;
    std::uint64_t end = align8(sizeof cb);
    cb.modules_offset = end;
    cb.module_capacity = cb.module_count = 1;
    end = align8(end + sizeof(iprobe_rt_module));
    cb.probes_offset = end;
    cb.probe_capacity = cb.probe_count = kProbes;
    end = align8(end + sizeof(iprobe_rt_probe) * kProbes);
    cb.hash_offset = end;
    cb.hash_bits = 4;
    end = align8(end + (sizeof(iprobe_rt_site) << 4));
    cb.stat_capacity = cb.stat_count = 2;
    cb.baseline_offset = end;
    end = align8(end + sizeof(iprobe_rt_fn_stats) * cb.stat_capacity);
    cb.exit_marks_offset = end;
    cb.exit_marks_written = 1;
    end = align8(end + sizeof(iprobe_rt_exit_marks));
    cb.threads_offset = end;
    cb.thread_count = 1;
    cb.thread_header_size = static_cast<std::uint32_t>(align8(sizeof(iprobe_rt_thread)));
    cb.thread_stride = align8(cb.thread_header_size + sizeof(iprobe_rt_fn_stats) * cb.stat_capacity);
    end += cb.thread_stride;
    cb.rings_offset = end;
    cb.ring_count = 1;
    cb.ring_records = kRecords;
    cb.ring_stride = align8(sizeof(iprobe_rt_ring) + sizeof(iprobe_rt_record) * kRecords);
    end += cb.ring_stride;
    cb.region_size = end;

    std::vector<std::uint8_t> region(end);
    std::memcpy(region.data(), &cb, sizeof cb);
    auto* module = at<iprobe_rt_module>(region, cb.modules_offset);
    std::strcpy(module->path, "/usr/bin/service");
    std::strcpy(module->probes_path, "/usr/bin/service.probes");
    module->build_id_size = 20;
    module->probe_count = kProbes;
    module->load_bias = 0x555555554000;
    auto* probes = at<iprobe_rt_probe>(region, cb.probes_offset);
    for (std::uint32_t i = 0; i < kProbes; i++) {
        probes[i] = {};
        probes[i].id = i;
        probes[i].kind = static_cast<std::uint8_t>(i % 2);
        probes[i].enabled = 1;
        probes[i].size = 5;
        probes[i].site = module->load_bias + 0x1100 + 16 * i;
        probes[i].stat = i / 2;
        probes[i].timed = i % 2 == 0;
    }
    auto* thread = at<iprobe_rt_thread>(region, cb.threads_offset);
    thread->state = IPROBE_RT_RING_OWNED;
    thread->tid = 4242;
    auto* sums = at<iprobe_rt_fn_stats>(region, cb.threads_offset + cb.thread_header_size);
    sums[0].calls = sums[0].completed = sums[0].timed = 3;
    sums[0].inclusive_ticks = sums[0].exclusive_ticks = 3000;
    sums[0].max_ticks = 1500;
    sums[0].histogram[9] = 2;
    sums[0].histogram[10] = 1;
    sums[1].calls = 1;
    auto* marks = at<iprobe_rt_exit_marks>(region, cb.exit_marks_offset);
    marks->state = 1;  // one written, none taken
    marks->mark[0] = {1150, 1, 4242, 1};  // before the point: the entry's call lost its exit
    auto* ring = at<iprobe_rt_ring>(region, cb.rings_offset);
    ring->state = IPROBE_RT_RING_OWNED;
    ring->tid = 4242;
    ring->head = 4;
    auto* records = reinterpret_cast<iprobe_rt_record*>(ring + 1);
    const std::uint8_t kinds[4] = {IPROBE_RT_REC_ENTRY, IPROBE_RT_REC_POINT, IPROBE_RT_REC_ARGS, IPROBE_RT_REC_EXIT};
    for (std::uint32_t i = 0; i < 4; i++) {
        records[i] = {};
        records[i].tsc = 1000 + 100 * i;
        records[i].probe = i == 3 ? 1 : 0;
        records[i].tid = 4242;
        records[i].kind = kinds[i];
        records[i].nargs = i == 1 ? 2 : 0;
    }
    return std::fwrite(region.data(), 1, region.size(), stdout) == region.size() ? 0 : 1;
}
