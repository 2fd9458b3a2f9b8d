#include "patch.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstddef>

#include "iprobe/support/error.h"

namespace iprobe::hotpatch {

std::optional<std::uint64_t> stub_address(const std::vector<Mapping>& maps, std::uint64_t low, std::uint64_t high,
                                          std::uint64_t size) {
    std::optional<std::uint64_t> best;
    std::uint64_t best_distance = ~0ull;
    std::uint64_t prev_end = 0x10000;
    std::string prev_path;
    auto consider = [&](std::uint64_t gap_low, std::uint64_t gap_high, bool after_heap) {
        if (gap_high <= gap_low || gap_high - gap_low < size) return;
        std::uint64_t candidate;
        if (gap_high <= low) candidate = gap_high - size;
        else if (after_heap) candidate = gap_high - size;
        else candidate = gap_low;
        const std::int64_t far = static_cast<std::int64_t>(std::max(
            candidate > low ? candidate + size - low : high - candidate, high > candidate ? high - candidate : candidate + size - low));
        if (far >= kReach) return;
        const std::uint64_t distance = candidate < low ? low - candidate : candidate - high;
        if (distance < best_distance) best = candidate, best_distance = distance;
    };
    for (const auto& m : maps) {
        consider(prev_end, m.start, prev_path == "[heap]");
        prev_end = std::max(prev_end, m.end);
        prev_path = m.path;
    }
    consider(prev_end, 0x7ffffffff000ull, prev_path == "[heap]");
    return best;
}

void sort_by_address(std::vector<Patch>& patches) {
    std::sort(patches.begin(), patches.end(), [](auto& a, auto& b) { return a.address < b.address; });
}

void apply_patches(StoppedProcess& process, const std::vector<Patch>& patches) {
    struct Run {
        std::uint64_t low, high;
        std::vector<std::uint8_t> before, after;
    };
    std::vector<Run> runs;
    for (std::size_t i = 0; i < patches.size();) {
        std::size_t j = i;
        std::uint64_t high = patches[i].address + patches[i].after.size;
        // One read-modify-write per span of nearby sites: unchanged bytes in
        // between are rewritten as they are (every thread is stopped), and a
        // page holding a site is copied-on-write anyway.
        while (j + 1 < patches.size() && patches[j + 1].address < high + kPage) {
            j++;
            high = std::max<std::uint64_t>(high, patches[j].address + patches[j].after.size);
        }
        Run run{patches[i].address, high, {}, {}};
        run.before.resize(high - run.low);
        process.read(run.low, run.before.data(), run.before.size());
        run.after = run.before;
        for (std::size_t k = i; k <= j; k++) {
            const auto& p = patches[k];
            if (!std::equal(p.before.begin(), p.before.end(), run.before.begin() + static_cast<long>(p.address - run.low)))
                throw Error("site " + hex_address(p.address) + " changed under us; nothing was written");
            std::copy(p.after.begin(), p.after.end(), run.after.begin() + static_cast<long>(p.address - run.low));
        }
        runs.push_back(std::move(run));
        i = j + 1;
    }
    std::size_t written = 0;
    try {
        for (; written < runs.size(); written++) {
            auto& run = runs[written];
            process.write(run.low, run.after.data(), run.after.size());
            std::vector<std::uint8_t> check(run.after.size());
            process.read(run.low, check.data(), check.size());
            if (check != run.after) throw Error("read-back of the patch at " + hex_address(run.low) + " differs");
        }
    } catch (...) {
        for (std::size_t k = 0; k <= written && k < runs.size(); k++) {
            try {
                process.write(runs[k].low, runs[k].before.data(), runs[k].before.size());
            } catch (...) {
            }
        }
        throw;
    }
}

std::string unsafe_pcs(const StoppedProcess& process, const std::vector<Patch>& patches) {
    for (const auto& t : process.threads()) {
        const std::uint64_t pc = t.regs.rip;
        auto it = std::upper_bound(patches.begin(), patches.end(), pc,
                                   [](std::uint64_t v, const Patch& p) { return v < p.address; });
        if (it == patches.begin()) continue;
        --it;
        if (pc > it->address && pc < it->address + it->after.size)
            return "thread " + std::to_string(t.tid) + " is inside site " + hex_address(it->address);
    }
    return {};
}

const std::string& handler_symbol(const HandlerSymbols& h, const probelist::Probe& p) {
    const bool nop = p.form == probelist::SiteForm::nop;
    switch (p.kind) {
    case probelist::ProbeKind::entry: return nop ? h.enter_nop : h.enter;
    case probelist::ProbeKind::exit: return nop ? h.exit_nop : h.exit;
    default: return nop ? h.point_nop : h.point;
    }
}

std::uint32_t counter_offset(std::uint32_t stat, probelist::ProbeKind kind) {
    constexpr std::uint64_t kNone = UINT32_MAX & ~std::uint64_t{7};
    if (stat == IPROBE_RT_NO_STAT) return kNone;
    const std::uint64_t at = std::uint64_t{stat} * sizeof(iprobe_rt_fn_stats) +
                             (kind == probelist::ProbeKind::exit ? offsetof(iprobe_rt_fn_stats, completed)
                                                      : offsetof(iprobe_rt_fn_stats, calls));
    return at < kNone ? static_cast<std::uint32_t>(at) : kNone;
}

const std::string& id_symbol(const HandlerSymbols& h, const probelist::Probe& p) {
    static const std::string none;
    if (p.form == probelist::SiteForm::nop) return none;
    return p.kind == probelist::ProbeKind::entry ? h.enter_id : p.kind == probelist::ProbeKind::exit ? h.exit_id : none;
}

std::optional<std::uint64_t> find_stub(const ProcessMemory& memory, const iprobe_rt_module& module,
                                       std::uint64_t target) {
    if (!module.stub_page) return std::nullopt;
    std::vector<std::uint8_t> page(kPage);
    memory.read(module.stub_page, page.data(), page.size());
    for (std::uint32_t i = 0; i < module.stub_used && i < kPage / kStubSize; i++)
        if (stub_target(page.data() + i * kStubSize) == target) return module.stub_page + i * kStubSize;
    return std::nullopt;
}

std::uint64_t stub_for(StoppedProcess& process, iprobe_rt_module& module, std::uint64_t target) {
    if (const auto found = find_stub(process.memory(), module, target)) return *found;
    if (module.stub_used >= kPage / kStubSize) throw Error("stub page full");
    const auto bytes = stub_bytes(target);
    const std::uint64_t at = module.stub_page + module.stub_used * kStubSize;
    process.write(at, bytes.data(), bytes.size());
    module.stub_used++;
    return at;
}

std::uint64_t map_stubs_near(StoppedProcess& process, const LoadedLibrary& libc, const RunningModule& running,
                             std::uint64_t size) {
    const auto mmap_at = libc.symbol("mmap");
    if (!mmap_at) throw Error("libc of the target has no mmap symbol", ExitCode::unavailable);
    for (int attempt = 0; attempt < 4; attempt++) {
        // Read afresh: stubs mapped a moment ago (for this or another module) are in it.
        const auto want = stub_address(read_maps(process.pid()), running.low, running.high, size);
        if (!want)
            throw Error("no free address within ±2 GiB of " + running.path + " for the jump stubs; cannot enable its probes",
                        ExitCode::unavailable);
        const std::uint64_t got =
            process.call(*mmap_at, {*want, size, PROT_READ | PROT_EXEC,
                                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, static_cast<std::uint64_t>(-1), 0});
        if (got == *want) return got;
        if (got != static_cast<std::uint64_t>(-1) && got < 0xfffffffffffff000ull) {
            if (auto munmap_at = libc.symbol("munmap")) process.call(*munmap_at, {got, size});
        }
    }
    throw Error("could not map jump stubs near " + running.path, ExitCode::unavailable);
}

void ensure_stub_page(StoppedProcess& process, const LoadedLibrary& libc, const RunningModule& running,
                      iprobe_rt_module& module) {
    if (module.stub_page) return;
    module.stub_page = map_stubs_near(process, libc, running, kPage);
    module.stub_used = 0;
}

bool has_site_stubs(const iprobe_rt_module& module, std::uint32_t slots) {
    return module.site_stubs && module.site_stub_slots >= std::max(slots, module.probe_count);
}

void ensure_site_stubs(StoppedProcess& process, const LoadedLibrary& libc, const RunningModule& running,
                       iprobe_rt_module& module, std::uint32_t slots) {
    if (has_site_stubs(module, slots)) return;
    slots = std::max(slots, module.probe_count);
    const std::uint64_t bytes = (std::uint64_t{slots} * kSiteStubSize + kPage - 1) / kPage * kPage;
    module.site_stubs = map_stubs_near(process, libc, running, bytes);
    module.site_stub_slots = slots;
}

namespace {
void sort_stubs(std::vector<SiteStub>& stubs) {
    std::sort(stubs.begin(), stubs.end(), [](const SiteStub& a, const SiteStub& b) {
        return a.area != b.area ? a.area < b.area : a.address < b.address;
    });
}

// Calls `run(first, last)` for each run of `stubs` (sorted) in one area.
template <typename Run>
void each_area(const std::vector<SiteStub>& stubs, Run&& run) {
    for (std::size_t i = 0; i < stubs.size();) {
        std::size_t j = i;
        while (j + 1 < stubs.size() && stubs[j + 1].area == stubs[i].area) j++;
        run(i, j);
        i = j + 1;
    }
}

// The bytes from the first stub of a run to the end of its last.
std::vector<std::uint8_t> span_of(const std::vector<SiteStub>& stubs, std::size_t first, std::size_t last) {
    return std::vector<std::uint8_t>(stubs[last].address + kSiteStubSize - stubs[first].address);
}
}  // namespace

void drop_written_stubs(const ProcessMemory& memory, std::vector<SiteStub>& stubs) {
    sort_stubs(stubs);
    std::vector<SiteStub> left;
    each_area(stubs, [&](std::size_t i, std::size_t j) {
        const std::uint64_t low = stubs[i].address;
        std::vector<std::uint8_t> held = span_of(stubs, i, j);
        memory.read(low, held.data(), held.size());
        for (std::size_t k = i; k <= j; k++)
            if (!std::equal(stubs[k].bytes.begin(), stubs[k].bytes.end(), held.data() + (stubs[k].address - low)))
                left.push_back(stubs[k]);
    });
    stubs = std::move(left);
}

void write_stubs_ahead(ProcessMemory& memory, std::vector<SiteStub>& stubs, const std::set<std::uint64_t>& unused_areas) {
    sort_stubs(stubs);
    std::vector<SiteStub> left;
    each_area(stubs, [&](std::size_t i, std::size_t j) {
        if (!unused_areas.count(stubs[i].area)) {
            left.insert(left.end(), stubs.begin() + static_cast<long>(i), stubs.begin() + static_cast<long>(j) + 1);
            return;
        }
        const std::uint64_t low = stubs[i].address;
        std::vector<std::uint8_t> span = span_of(stubs, i, j);
        memory.read(low, span.data(), span.size());
        for (std::size_t k = i; k <= j; k++)
            std::copy(stubs[k].bytes.begin(), stubs[k].bytes.end(), span.data() + (stubs[k].address - low));
        memory.write(low, span.data(), span.size());
    });
    stubs = std::move(left);
}

void write_site_stubs(StoppedProcess& process, std::vector<SiteStub>& stubs) {
    sort_stubs(stubs);
    each_area(stubs, [&](std::size_t i, std::size_t j) {
        const std::uint64_t low = stubs[i].address;
        const std::vector<std::uint8_t> before = [&] {
            std::vector<std::uint8_t> held = span_of(stubs, i, j);
            process.read(low, held.data(), held.size());
            return held;
        }();
        std::vector<std::uint8_t> after = before;
        for (std::size_t k = i; k <= j; k++) {
            const SiteStub& stub = stubs[k];
            std::uint8_t* slot = after.data() + (stub.address - low);
            if (std::equal(stub.bytes.begin(), stub.bytes.end(), slot)) continue;
            for (const auto& t : process.threads())
                if (t.regs.rip >= stub.address && t.regs.rip < stub.address + kSiteStubSize) throw RetryLater{};
            std::copy(stub.bytes.begin(), stub.bytes.end(), slot);
        }
        // Unchanged slots in between are rewritten as they are: every thread is stopped.
        if (after != before) process.write(low, after.data(), after.size());
    });
}

}  // namespace iprobe::hotpatch
