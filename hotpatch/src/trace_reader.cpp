#include "iprobe/trace_reader.hpp"

#include <cstring>
#include <optional>

#include "iprobe/probe_source.hpp"
#include "iprobe/support/error.h"
#include "iprobe/support/lock_file.h"
#include "region.hpp"

namespace iprobe::hotpatch {

struct TraceReader::Impl {
    std::optional<LockFile> reader_lock;
    pid_t pid = 0;
    Region region;
    std::vector<ProbeInfo> probes;
    std::uint32_t modules_loaded = 0;
    ProbeInfo unknown{"?", "", 0, ProbeKind::entry, ""};

    void load_new_modules() {
        const auto* cb = region.control();
        for (; modules_loaded < cb->module_count && modules_loaded < cb->module_capacity; modules_loaded++) {
            const iprobe_rt_module& m = region.modules()[modules_loaded];
            if (m.first_probe > cb->probe_capacity || m.probe_count > cb->probe_capacity - m.first_probe) continue;
            const std::string probes_path(m.probes_path, ::strnlen(m.probes_path, sizeof m.probes_path));
            const std::string module_path(m.path, ::strnlen(m.path, sizeof m.path));
            if (probes.size() < m.first_probe + m.probe_count) probes.resize(m.first_probe + m.probe_count, unknown);
            try {
                const ProbeList list = load_probes(probes_path);
                for (const auto& p : list.probes) {
                    if (p.id >= m.probe_count) continue;
                    probes[m.first_probe + p.id] = {p.demangled.empty() ? p.function : p.demangled, p.file, p.line,
                                                    p.kind, module_path};
                }
            } catch (const Error&) {
                // The list moved away: events stay numbered, not named.
            }
        }
    }
};

TraceReader::TraceReader(pid_t pid) : impl_(std::make_unique<Impl>()) {
    impl_->pid = pid;
    impl_->region = Region::open(pid);
    // Readers consume: two at once would split (or repeat) the events.
    impl_->reader_lock.emplace(std::to_string(pid) + ".reader.lock",
                               "another iprobe trace or report is reading process " + std::to_string(pid) +
                                   "; events are consumed once, so stop it first");
    impl_->load_new_modules();
}

TraceReader::~TraceReader() = default;

std::size_t TraceReader::drain(const std::function<void(const Event&)>& sink) {
    const auto* cb = impl_->region.control();
    const std::uint64_t mask = cb->ring_records - 1;
    const double ns_per_tick = 1e9 / static_cast<double>(cb->tsc_hz ? cb->tsc_hz : 1);
    std::size_t events = 0;
    for (std::uint32_t i = 0; i < cb->ring_count; i++) {
        iprobe_rt_ring* ring = impl_->region.ring(i);
        const std::uint32_t state = __atomic_load_n(&ring->state, __ATOMIC_ACQUIRE);
        if (state == IPROBE_RT_RING_FREE) continue;
        const std::uint64_t head = __atomic_load_n(&ring->head, __ATOMIC_ACQUIRE);
        std::uint64_t tail = ring->tail;
        // A nested publish may briefly leave head behind what was consumed.
        if (head > tail) {
            if (head - tail > cb->ring_records) tail = head - cb->ring_records;  // never read unpublished slots
            const iprobe_rt_record* records = impl_->region.records(i);
            while (tail < head) {
                const iprobe_rt_record& r = records[tail & mask];
                Event e;
                e.tsc = r.tsc;
                e.time_ns = cb->realtime_ns_base +
                            static_cast<std::uint64_t>(static_cast<double>(static_cast<std::int64_t>(r.tsc - cb->tsc_base)) *
                                                       ns_per_tick);
                e.probe = r.probe;
                e.tid = r.tid;
                e.depth = r.depth;
                tail++;
                if (r.kind == IPROBE_RT_REC_POINT) {
                    e.kind = ProbeKind::point;
                    if (r.nargs && tail < head) {
                        const auto* more = reinterpret_cast<const iprobe_rt_args_record*>(&records[tail & mask]);
                        e.nargs = r.nargs;
                        std::memcpy(e.args, more->args, sizeof e.args);
                        tail++;
                    }
                } else if (r.kind == IPROBE_RT_REC_EXIT) {
                    e.kind = ProbeKind::exit;
                } else if (r.kind == IPROBE_RT_REC_ENTRY) {
                    e.kind = ProbeKind::entry;
                } else {
                    continue;
                }
                sink(e);
                events++;
            }
            __atomic_store_n(&ring->tail, tail, __ATOMIC_RELEASE);
        }
        if (state == IPROBE_RT_RING_RETIRED &&
            __atomic_load_n(&ring->head, __ATOMIC_ACQUIRE) <= __atomic_load_n(&ring->tail, __ATOMIC_ACQUIRE)) {
            std::uint32_t expected = IPROBE_RT_RING_RETIRED;
            __atomic_compare_exchange_n(&ring->state, &expected, IPROBE_RT_RING_FREE, false, __ATOMIC_ACQ_REL,
                                        __ATOMIC_RELAXED);
        }
    }
    return events;
}

const ProbeInfo& TraceReader::probe(std::uint32_t index) {
    if (index >= impl_->probes.size()) impl_->load_new_modules();
    return index < impl_->probes.size() ? impl_->probes[index] : impl_->unknown;
}

std::uint32_t TraceReader::probe_count() const { return impl_->region.control()->probe_count; }

std::uint64_t TraceReader::dropped() const {
    const auto* cb = impl_->region.control();
    std::uint64_t total = 0;
    for (std::uint32_t i = 0; i < cb->ring_count; i++) {
        const iprobe_rt_ring* r = impl_->region.ring(i);
        total += __atomic_load_n(&r->dropped, __ATOMIC_RELAXED) - r->dropped_seen;
    }
    return total;
}

std::uint64_t TraceReader::take_dropped() {
    const auto* cb = impl_->region.control();
    std::uint64_t total = 0;
    for (std::uint32_t i = 0; i < cb->ring_count; i++) {
        iprobe_rt_ring* r = impl_->region.ring(i);
        const std::uint64_t now = __atomic_load_n(&r->dropped, __ATOMIC_RELAXED);
        total += now - r->dropped_seen;
        r->dropped_seen = now;
    }
    return total;
}

std::uint64_t TraceReader::take_calls(std::uint32_t index) {
    return index < probe_count() ? __atomic_exchange_n(&impl_->region.counts()[index], 0, __ATOMIC_RELAXED) : 0;
}

std::uint64_t TraceReader::lost_events() const {
    const auto* cb = impl_->region.control();
    return cb->no_ring_events + cb->unknown_site_events;
}

std::uint64_t TraceReader::calls(std::uint32_t index) const {
    return index < probe_count() ? __atomic_load_n(&impl_->region.counts()[index], __ATOMIC_RELAXED) : 0;
}

double TraceReader::tsc_hz() const { return static_cast<double>(impl_->region.control()->tsc_hz); }

pid_t TraceReader::pid() const { return impl_->pid; }

}  // namespace iprobe::hotpatch
