#include "iprobe/hotpatch/trace_reader.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <map>
#include <set>
#include <optional>
#include <utility>

#include "iprobe/hotpatch/hotpatch.h"
#include "iprobe/support/error.h"
#include "iprobe/support/json.h"
#include "iprobe/support/lock_file.h"
#include "region.h"
#include "values_reader.h"

namespace iprobe::hotpatch {

namespace {

// The latency at quantile q of a log2 histogram of ticks, interpolated
// inside its bucket and never above the largest call seen.
std::uint64_t quantile_ticks(const iprobe_rt_fn_stats& s, double q) {
    std::uint64_t total = 0;
    for (auto n : s.histogram) total += n;
    if (total == 0) return 0;
    const double want = q * static_cast<double>(total);
    std::uint64_t below = 0;
    for (int b = 0; b < IPROBE_RT_HIST_BUCKETS; b++) {
        const std::uint64_t n = s.histogram[b];
        if (n && static_cast<double>(below + n) >= want) {
            const double low = b == 0 ? 0.0 : static_cast<double>(1ull << b);
            const double high = static_cast<double>(2ull << b);
            const double at = low + (high - low) * (want - static_cast<double>(below)) / static_cast<double>(n);
            return std::min<std::uint64_t>(static_cast<std::uint64_t>(at), s.max_ticks);
        }
        below += n;
    }
    return s.max_ticks;
}

void add(iprobe_rt_fn_stats& to, const iprobe_rt_fn_stats& s) {
    to.calls += s.calls;
    to.completed += s.completed;
    to.timed += s.timed;
    to.inclusive_ticks += s.inclusive_ticks;
    to.exclusive_ticks += s.exclusive_ticks;
    to.max_ticks = std::max(to.max_ticks, s.max_ticks);
    to.matched += s.matched;
    to.undecided += s.undecided;
    for (int b = 0; b < IPROBE_RT_HIST_BUCKETS; b++) to.histogram[b] += s.histogram[b];
    for (int b = 0; b < IPROBE_RT_RETVAL_BUCKETS; b++) to.retval_histogram[b] += s.retval_histogram[b];
}

std::uint64_t minus(std::uint64_t a, std::uint64_t b) { return a > b ? a - b : 0; }

std::uint64_t saturated(double v);

// Of two on/off histories, the one with more time on: more finished time,
// and the earlier start of a stretch still running.
void keep_longest(ProbeState& into, std::uint64_t live_ns, std::uint64_t live_since_ns) {
    into.live_ns = std::max(into.live_ns, live_ns);
    if (live_since_ns && (!into.live_since_ns || live_since_ns < into.live_since_ns)) into.live_since_ns = live_since_ns;
}

// The ns fields of `f` from its raw sums.
void fill_times(FunctionStats& f) {
    auto ns = [&](std::uint64_t ticks) { return saturated(static_cast<double>(ticks) * f.ns_per_tick); };
    f.calls = f.raw.calls;
    f.completed = f.raw.completed;
    f.timed = f.raw.timed;
    f.inclusive_ns = ns(f.raw.inclusive_ticks);
    f.exclusive_ns = ns(f.raw.exclusive_ticks);
    f.max_ns = ns(f.raw.max_ticks);
    f.p50_ns = ns(quantile_ticks(f.raw, 0.50));
    f.p99_ns = ns(quantile_ticks(f.raw, 0.99));
}

// CLOCK_REALTIME ns of a tick count.  Ticks before the calibration point (a
// skewed TSC, or a region the target wrote) count backwards; the result
// saturates instead of wrapping.
// A non-negative double as a count, saturating where it does not fit (a
// conversion out of range is undefined).
std::uint64_t saturated(double v) {
    constexpr double kLimit = 9.2e18;  // below 2^63
    return v < kLimit ? static_cast<std::uint64_t>(v > 0 ? v : 0) : UINT64_MAX;
}

std::uint64_t wall_clock_ns(std::uint64_t tsc, std::uint64_t tsc_base, std::uint64_t realtime_base, double ns_per_tick) {
    const double offset = static_cast<double>(static_cast<std::int64_t>(tsc - tsc_base)) * ns_per_tick;
    if (offset < 0) return minus(realtime_base, saturated(-offset));
    const std::uint64_t ahead = saturated(offset);
    return ahead > UINT64_MAX - realtime_base ? UINT64_MAX : realtime_base + ahead;
}

// Threads of a lossless trace asleep on the ring's tail (its low 32 bits;
// shared futex: they are in another process).
void wake_waiters(iprobe_rt_ring* ring) {
    ::syscall(SYS_futex, &ring->tail, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace

struct TraceReader::Impl {
    std::optional<LockFile> reader_lock;
    bool stream = false;  // the one consumer of the event rings
    bool lossless = false;  // this reader asked the threads to wait for it
    // Per ring, what mincore() already said (a memfd page stays resident
    // from its first write until the region dies): 1 its header was
    // written, 2 every page of its records too.  Saves a drain pass its
    // system calls per ring.
    std::vector<std::uint8_t> ring_known;
    pid_t pid = 0;
    Region region;
    std::vector<ProbeInfo> probes;
    std::uint32_t modules_loaded = 0;
    ProbeInfo unknown{"?", "?", "", 0, probelist::ProbeKind::entry, ""};
    std::unique_ptr<ValuesReader> values;  // made at the first values record
    // decode(): an event whose continuation records (a POINT's arguments,
    // an ENTRY's or EXIT's values) are still to come, perhaps in the ring's
    // next run.
    struct Decoding {
        Event pending;
        bool open = false;                 // `pending` not yet given to the sink
        std::uint32_t remaining = 0;       // continuation records still to read
        std::vector<std::uint64_t> words;  // values read so far
        std::uint32_t spec = 0;            // the spec they were written under (iprobe_rt_record.values)
        std::uint32_t ring = UINT32_MAX;
        std::uint64_t next_at = 0;         // where the pending event's next record is
        PendingGap gap;                    // owned by a ring
    } decoding;
    PendingExitMarks exit_marks;           // taken from the region, not yet given to an event
    std::uint64_t exit_marks_seen = 0;     // iprobe_rt_control.exit_marks_written when last taken

    // The exit marks detaches wrote since the last look, taken: to `sink`
    // and kept for decode().  Called after a ring's head was read, so a
    // mark is known before any record written after it (the detacher adds
    // to exit_marks_written in its stop, after its marks).  A queue being
    // written is left: that detacher's count moves after it.
    void take_exit_marks_now(const std::function<void(const ExitMark&)>& sink) {
        const std::uint64_t written = __atomic_load_n(&region.control()->exit_marks_written, __ATOMIC_ACQUIRE);
        if (written == exit_marks_seen || !region.exit_marks(0)) return;
        exit_marks_seen = written;
        const std::uint32_t slots = region.thread_count();
        const auto first = reinterpret_cast<std::uintptr_t>(region.exit_marks(0));
        const auto page0 = first & ~std::uintptr_t{4095};
        const auto pages = region.touched_pages(region.exit_marks(0), sizeof(iprobe_rt_exit_marks) * slots);
        for (std::uint32_t t = 0; t < slots; t++) {
            iprobe_rt_exit_marks* queue = region.exit_marks(t);
            const auto at = reinterpret_cast<std::uintptr_t>(queue);
            const std::size_t page = (at - page0) / 4096, last = (at + sizeof *queue - 1 - page0) / 4096;
            if (last >= pages.size() || (!pages[page] && !pages[last])) continue;  // never written
            for (const ExitMark& m : take_exit_marks(*queue)) {
                exit_marks.add(m);
                if (sink) sink(m);
            }
        }
    }

    void load_new_modules() {
        const std::uint32_t count = region.module_count();
        for (; modules_loaded < count; modules_loaded++) {
            const iprobe_rt_module m = region.modules()[modules_loaded];
            if (m.first_probe > region.probe_capacity() || m.probe_count > region.probe_capacity() - m.first_probe)
                continue;
            const std::string module_path(m.path, ::strnlen(m.path, sizeof m.path));
            if (probes.size() < m.first_probe + m.probe_count) probes.resize(m.first_probe + m.probe_count, unknown);
            // A list that moved away or is not a regular file: events stay
            // numbered, not named.
            if (const auto list = module_probe_list(m))
                for (const auto& p : list->probes) {
                    if (p.id >= m.probe_count) continue;
                    probes[m.first_probe + p.id] = {p.demangled.empty() ? p.function : p.demangled, p.function,
                                                    p.file, p.line, p.kind, module_path};
                }
        }
    }
};

TraceReader::TraceReader(pid_t pid, Access access) : impl_(std::make_unique<Impl>()) {
    impl_->pid = pid;
    impl_->region = Region::open(pid);
    // The stream is consumed: two readers at once would split (or repeat) it.
    impl_->stream = access == Access::stream;
    if (impl_->stream)
        impl_->reader_lock.emplace(std::to_string(pid) + ".reader.lock",
                                   "another iprobe trace is reading the events of process " + std::to_string(pid) +
                                       "; events are consumed once, so stop it first");
    impl_->load_new_modules();
}

TraceReader::TraceReader(UniqueFd region, Access access) : impl_(std::make_unique<Impl>()) {
    impl_->region = Region::adopt(std::move(region), "the iprobe region handed over");
    impl_->stream = access == Access::stream;
    impl_->load_new_modules();
}

TraceReader::~TraceReader() {
    if (impl_ && impl_->lossless) set_lossless(false);
}

void TraceReader::set_lossless(bool on) {
    if (!impl_->stream) throw Error("only the reader of the event stream can make it lossless");
    impl_->lossless = on;
    __atomic_store_n(&impl_->region.control()->lossless, on ? 1u : 0u, __ATOMIC_RELEASE);
}

bool TraceReader::lossless() const { return impl_->lossless; }

std::chrono::microseconds TraceReader::pause_after(std::size_t drained) const {
    // bench/hotpatch/lua_trace.sh: 2048 to 8192 records and 100 us measured the same.
    constexpr std::size_t kLosslessBatchRecords = 4096;
    using std::chrono::microseconds;
    if (lossless()) return drained >= kLosslessBatchRecords ? microseconds(0) : microseconds(100);
    return drained > 0 ? microseconds(0) : microseconds(5000);
}

std::uint64_t TraceReader::lossless_timeouts() const {
    return __atomic_load_n(&impl_->region.control()->lossless_timeouts, __ATOMIC_RELAXED);
}

WallClock TraceReader::wall_clock() const {
    const auto* cb = impl_->region.control();
    const std::uint64_t hz = cb->tsc_hz;
    return {cb->tsc_base, cb->realtime_ns_base, 1e9 / static_cast<double>(hz ? hz : 1)};
}

std::uint64_t WallClock::ns(std::uint64_t tsc) const { return wall_clock_ns(tsc, tsc_base, realtime_base, ns_per_tick); }

std::size_t TraceReader::drain_runs(const std::function<void(const RecordRun&)>& sink,
                                    const std::function<void(const ExitMark&)>& marks) {
    if (!impl_->stream) throw Error("this reader does not consume the event stream");
    const Region& region = impl_->region;
    const std::uint64_t records_per_ring = region.ring_records();
    const std::uint64_t mask = records_per_ring - 1;
    std::size_t consumed = 0;
    auto& known = impl_->ring_known;
    known.resize(region.ring_count(), 0);
    for (std::uint32_t i = 0; i < region.ring_count(); i++) {
        if (interrupted()) break;  // Ctrl-C: within one ring's worth of events
        iprobe_rt_ring* ring = region.ring(i);
        // Threads claim the lowest free ring (rt.c claim_ring_now), reading
        // every ring below it: past the first never touched, none is.
        if (!known[i] && !region.touched(ring, sizeof *ring)) break;
        known[i] = std::max<std::uint8_t>(known[i], 1);
        const std::uint32_t state = __atomic_load_n(&ring->state, __ATOMIC_ACQUIRE);
        if (state == IPROBE_RT_RING_FREE) continue;
        const std::uint64_t head = __atomic_load_n(&ring->head, __ATOMIC_ACQUIRE);
        impl_->take_exit_marks_now(marks);
        std::uint64_t tail = ring->tail;
        // A nested publish may briefly leave head behind what was consumed.
        if (head > tail) {
            if (head - tail > records_per_ring) tail = head - records_per_ring;  // never read unpublished slots
            const iprobe_rt_record* records = region.records(i);
            // Pages of the ring never written hold no event (a head the
            // target made up): skipped, never faulted in.  A run ends at a
            // page's end (a record never straddles one) or the ring's.
            std::vector<unsigned char> written;
            if (known[i] < 2) {
                written = region.touched_pages(records, records_per_ring * sizeof *records);
                if (std::all_of(written.begin(), written.end(), [](unsigned char w) { return w != 0; })) known[i] = 2;
            }
            const auto first_page = reinterpret_cast<std::uintptr_t>(records) & ~std::uintptr_t{4095};
            while (tail < head) {
                const auto at = reinterpret_cast<std::uintptr_t>(&records[tail & mask]);
                const std::uint64_t page = (at - first_page) / 4096;
                const std::uint64_t in_page = (4096 - at % 4096) / sizeof *records;
                // (head - tail, never tail + room: a head the target made up near 2^64 would wrap)
                const std::uint64_t room = std::min<std::uint64_t>(in_page, records_per_ring - (tail & mask));
                const std::uint64_t end = head - tail < room ? head : tail + room;
                if (known[i] == 2 || (page < written.size() && written[page])) {
                    sink({records, mask, tail, end, end == head, i});
                    consumed += end - tail;
                }
                tail = end;
                // Room for a spinning thread a page at a time.
                __atomic_store_n(&ring->tail, tail, __ATOMIC_SEQ_CST);
            }
            // A sleeping one is woken once the ring is drained (rt.c wait_for_room).
            if (__atomic_load_n(&ring->waiters, __ATOMIC_SEQ_CST)) wake_waiters(ring);
        }
        if (state == IPROBE_RT_RING_RETIRED &&
            __atomic_load_n(&ring->head, __ATOMIC_ACQUIRE) <= __atomic_load_n(&ring->tail, __ATOMIC_ACQUIRE)) {
            std::uint32_t expected = IPROBE_RT_RING_RETIRED;
            __atomic_compare_exchange_n(&ring->state, &expected, IPROBE_RT_RING_FREE, false, __ATOMIC_ACQ_REL,
                                        __ATOMIC_RELAXED);
        }
    }
    return consumed;
}

std::size_t TraceReader::drain(const std::function<void(const Event&)>& sink) {
    std::size_t events = 0;
    drain_runs([&](const RecordRun& run) { events += decode(run, sink); });
    return events + decode_end(sink);
}

ValueTypes& TraceReader::value_types() {
    if (!impl_->values) impl_->values = std::make_unique<ValuesReader>(impl_->region, impl_->pid);
    return *impl_->values;
}

// The pending event with what it got.
std::size_t TraceReader::decode_end(const std::function<void(const Event&)>& sink) {
    Impl::Decoding& d = impl_->decoding;
    if (!d.open) return 0;
    d.open = false;
    if (d.pending.kind == probelist::ProbeKind::point) {
        if (d.remaining) d.pending.nargs = 0;
    } else if (!d.words.empty()) {
        decode_values(d.pending, d.spec, d.words, value_types());
    }
    d.remaining = 0;
    d.words.clear();
    sink(d.pending);
    return 1;
}

std::size_t TraceReader::decode(const RecordRun& run, const std::function<void(const Event&)>& sink) {
    Impl::Decoding& d = impl_->decoding;
    const WallClock clock = wall_clock();
    std::size_t events = 0;
    // Its ring's next page was skipped, or another ring: the event ends here.
    if (d.open && (run.ring != d.ring || run.from != d.next_at)) events += decode_end(sink);
    d.ring = run.ring;
    for (std::uint64_t at = run.from; at < run.to; at++) {
        const iprobe_rt_record& r = run.records[at & run.mask];
        if (d.open) {
            const auto* more = reinterpret_cast<const iprobe_rt_args_record*>(&r);
            if (d.pending.kind == probelist::ProbeKind::point) std::memcpy(d.pending.args, more->args, sizeof d.pending.args);
            else d.words.insert(d.words.end(), more->args, more->args + 4);
            if (--d.remaining == 0) events += decode_end(sink);
            continue;
        }
        Event e;
        if (exit_without_time(r)) [[unlikely]] {
            e.stamped = false;
        } else {
            e.tsc = r.tsc;
            e.time_ns = clock.ns(r.tsc);
        }
        e.probe = r.probe;
        e.tid = r.tid;
        e.depth = r.depth;
        std::uint32_t more = 0;
        if (r.kind == IPROBE_RT_REC_POINT) {
            e.kind = probelist::ProbeKind::point;
            if (r.nargs) {
                e.nargs = std::min<std::uint8_t>(r.nargs, 4);
                more = 1;
            }
        } else if (r.kind == IPROBE_RT_REC_EXIT || r.kind == IPROBE_RT_REC_ENTRY) {
            e.kind = r.kind == IPROBE_RT_REC_EXIT ? probelist::ProbeKind::exit : probelist::ProbeKind::entry;
            e.frame = r.frame;
            e.inlined_copy = r.kind == IPROBE_RT_REC_ENTRY && (r.values & IPROBE_RT_VALUES_COPY);
            more = r.nargs;
            d.spec = r.values;
        } else if (r.kind == IPROBE_RT_REC_GAP) {
            d.gap.add(run.ring, r.frame);
            continue;
        } else {
            continue;
        }
        e.dropped_before = d.gap.take(run.ring);
        if (!impl_->exit_marks.empty() && e.stamped) [[unlikely]]
            for (const ExitMark& m : impl_->exit_marks.take(e.tid, e.tsc))
                e.exits_lost_before.push_back(
                    {m.probe == IPROBE_RT_EXIT_MARK_ANY ? std::string() : probe(m.probe).function, m.count, clock.ns(m.at)});
        if (r.probe < impl_->region.probe_count())
            entry_without_exit(e, static_cast<probelist::ProbeKind>(impl_->region.probes()[r.probe].kind), r.values);
        d.pending = std::move(e);
        d.remaining = more;
        d.open = true;
        if (!d.remaining) events += decode_end(sink);
    }
    d.next_at = run.to;
    if (d.open && run.last) events += decode_end(sink);  // cut by what the ring had published
    return events;
}

const ProbeInfo& TraceReader::probe(std::uint32_t index) {
    if (index >= impl_->probes.size()) impl_->load_new_modules();
    return index < impl_->probes.size() ? impl_->probes[index] : impl_->unknown;
}

const std::vector<ProbeInfo>& TraceReader::probes() {
    impl_->load_new_modules();
    return impl_->probes;
}

std::uint32_t TraceReader::probe_count() const { return impl_->region.probe_count(); }

std::vector<ProbeState> TraceReader::probe_states() const {
    const Region& region = impl_->region;
    std::vector<ProbeState> out(region.probe_count());
    for (std::uint32_t i = 0; i < out.size(); i++) {
        const iprobe_rt_probe& p = region.probes()[i];
        out[i].stat = p.stat;
        out[i].live = p.enabled != 0;
        out[i].live_ns = p.live_ns;
        out[i].live_since_ns = p.enabled ? p.live_since_ns : 0;
        out[i].kept = p.kept;
        out[i].condition = p.condition;
        out[i].retval_hist = p.retval_hist != 0;
    }
    return out;
}

std::uint64_t TraceReader::window_start_ns() const { return impl_->region.control()->realtime_ns_base; }

std::vector<iprobe_rt_fn_stats> TraceReader::sums() const {
    const Region& region = impl_->region;
    const std::uint32_t stats = region.stat_count();
    std::vector<iprobe_rt_fn_stats> out(stats, iprobe_rt_fn_stats{});
    for (std::uint32_t t = 0; t < region.thread_count(); t++) {
        const iprobe_rt_thread* slot = region.thread(t);
        if (!region.touched(slot, sizeof *slot) ||
            __atomic_load_n(&slot->state, __ATOMIC_ACQUIRE) == IPROBE_RT_RING_FREE)
            continue;
        const iprobe_rt_fn_stats* own = region.thread_stats(t);
        // Pages a thread never touched are skipped, not faulted in.
        const auto page0 = reinterpret_cast<std::uintptr_t>(own) & ~std::uintptr_t{4095};
        const auto pages = region.touched_pages(own, sizeof *own * stats);
        for (std::uint32_t s = 0; s < stats; s++) {
            const auto first = (reinterpret_cast<std::uintptr_t>(&own[s]) - page0) / 4096;
            const auto last = (reinterpret_cast<std::uintptr_t>(&own[s + 1]) - 1 - page0) / 4096;
            if (last >= pages.size() || (!pages[first] && !pages[last])) continue;
            iprobe_rt_fn_stats copy;
            std::memcpy(&copy, &own[s], sizeof copy);
            add(out[s], copy);
        }
    }
    return out;
}

std::vector<iprobe_rt_fn_stats> TraceReader::baseline() const {
    const Region& region = impl_->region;
    std::vector<iprobe_rt_fn_stats> out(region.stat_count(), iprobe_rt_fn_stats{});
    if (region.touched(region.baseline(), sizeof(iprobe_rt_fn_stats) * out.size()))
        std::memcpy(out.data(), region.baseline(), sizeof(iprobe_rt_fn_stats) * out.size());
    return out;
}

void TraceReader::mark_baseline(const std::vector<iprobe_rt_fn_stats>& sums) {
    const std::size_t n = std::min<std::size_t>(sums.size(), impl_->region.stat_capacity());
    std::memcpy(impl_->region.baseline(), sums.data(), sizeof(iprobe_rt_fn_stats) * n);
}

std::vector<FunctionStats> TraceReader::functions(const std::vector<iprobe_rt_fn_stats>& sums,
                                                  const std::vector<iprobe_rt_fn_stats>* since) {
    impl_->load_new_modules();
    // Name of each aggregate slot: any probe that feeds it; when its probes
    // were live: the longest of them.
    std::vector<const ProbeInfo*> names(sums.size(), nullptr);
    std::vector<ProbeState> live(sums.size());
    std::set<std::uint32_t> conditioned, with_retval;  // functions with a condition, with a retval histogram
    const std::vector<ProbeState> states = probe_states();
    for (std::uint32_t i = 0; i < states.size() && i < impl_->probes.size(); i++) {
        const std::uint32_t stat = states[i].stat;
        if (stat >= names.size()) continue;
        if (!names[stat]) names[stat] = &impl_->probes[i];
        keep_longest(live[stat], states[i].live_ns, states[i].live_since_ns);
        live[stat].kept |= states[i].kept;
        if (states[i].condition) conditioned.insert(stat);
        if (states[i].retval_hist) with_retval.insert(stat);
    }
    const std::uint64_t window_start = window_start_ns();
    const double ns_per_tick = 1e9 / tsc_hz();
    std::vector<FunctionStats> out;
    for (std::uint32_t i = 0; i < sums.size(); i++) {
        iprobe_rt_fn_stats s = sums[i];
        if (since && i < since->size()) {
            const iprobe_rt_fn_stats& b = (*since)[i];
            s.calls = minus(s.calls, b.calls);
            s.completed = minus(s.completed, b.completed);
            s.timed = minus(s.timed, b.timed);
            s.inclusive_ticks = minus(s.inclusive_ticks, b.inclusive_ticks);
            s.exclusive_ticks = minus(s.exclusive_ticks, b.exclusive_ticks);
            s.matched = minus(s.matched, b.matched);
            s.undecided = minus(s.undecided, b.undecided);
            for (int k = 0; k < IPROBE_RT_HIST_BUCKETS; k++) s.histogram[k] = minus(s.histogram[k], b.histogram[k]);
            for (int k = 0; k < IPROBE_RT_RETVAL_BUCKETS; k++)
                s.retval_histogram[k] = minus(s.retval_histogram[k], b.retval_histogram[k]);
        }
        if (s.calls == 0 && s.completed == 0) continue;
        FunctionStats f;
        f.stat = i;
        f.function = names[i] ? names[i]->function : "?";
        f.symbol = names[i] ? names[i]->symbol : "?";
        f.kind = names[i] ? names[i]->kind : probelist::ProbeKind::entry;
        f.raw = s;
        f.ns_per_tick = ns_per_tick;
        f.live_ns = live[i].live_ns;
        f.live_since_ns = live[i].live_since_ns;
        f.window_start_ns = window_start;
        if (live[i].kept) f.kept = live[i].kept;  // else made before kept was recorded: all shown
        f.conditioned = conditioned.count(i) || s.matched || s.undecided;
        f.retval_histogram = with_retval.count(i) != 0;
        fill_times(f);
        out.push_back(std::move(f));
    }
    return out;
}

void CallNesting::records(const Event& e, const ProbeInfo& info, const std::function<void(const TraceRecord&)>& sink) {
    constexpr std::size_t kMaxThreads = 1u << 16, kMaxDepth = 256, kMaxOpen = 1u << 16;
    if (stacks_.size() >= kMaxThreads && !stacks_.count(e.tid)) stacks_.clear(), last_ns_.clear();
    auto& stack = stacks_[e.tid];
    std::uint64_t& last_ns = last_ns_[e.tid];
    if (e.stamped) last_ns = e.time_ns;
    const std::uint64_t time_ns = e.stamped ? e.time_ns : last_ns;
    const auto depth = [&](std::size_t open) { return static_cast<int>(std::min(open, kMaxDepth)); };
    // A frame at or above an open one's return slot (the stack grows down)
    // means the open one is gone without an exit: unwound.  At it: a new
    // call there ends the one before, but an inlined copy's entry (its
    // frame is its host's) or an exit is inside it.
    // After a gap the calls open before it may have ended unseen: the
    // thread's nesting starts afresh, and the record says how many were missed.
    if (e.dropped_before) stack.clear();
    // Calls a detach left without their exits, closed before this event.
    std::vector<std::string> closed;
    std::uint64_t lost = 0;
    if (!e.exits_lost_before.empty()) [[unlikely]] {
        closed = close_lost(stack, e.exits_lost_before);
        for (const LostExits& l : e.exits_lost_before) lost += l.count;
    }
    const bool new_frame = e.kind == probelist::ProbeKind::entry && !e.inlined_copy;
    if (e.frame && e.depth == 0)
        while (!stack.empty() && stack.back().frame &&
               (new_frame ? stack.back().frame <= e.frame : stack.back().frame < e.frame)) {
            TraceRecord u{time_ns, e.tid, probelist::ProbeKind::exit, stack.back().function, depth(stack.size() - 1),
                          {}, false};
            u.has_arguments = stack.back().has_arguments;
            u.arguments = std::move(stack.back().arguments);
            u.unwound = true;
            stack.pop_back();
            sink(u);
        }
    TraceRecord r{time_ns, e.tid, e.kind, info.function, 0, {}, e.depth != 0};
    r.stamped = e.stamped;
    r.exit_traced = e.exit_traced;
    r.dropped_before = e.dropped_before;
    if (lost) {
        r.exits_lost_before = lost;
        r.exits_closed = std::move(closed);
        r.exits_lost_ns = e.exits_lost_before.back().at_ns;
    }
    if (e.kind == probelist::ProbeKind::point) r.args.assign(e.args, e.args + std::min<int>(e.nargs, 4));
    if (e.kind == probelist::ProbeKind::entry && e.has_values) {
        r.has_arguments = true;
        r.arguments = e.values;
    }
    if (e.kind == probelist::ProbeKind::exit && !stack.empty()) {
        if (stack.back().function == info.function) {
            r.has_arguments = stack.back().has_arguments;
            r.arguments = std::move(stack.back().arguments);
        }
        stack.pop_back();
    }
    r.depth = depth(stack.size());
    r.retval = e.retval;
    r.backtrace = e.backtrace;
    if (e.kind == probelist::ProbeKind::entry && e.exit_traced) {
        if (stack.size() >= kMaxOpen) stack.pop_front();  // bounded: the target writes the rings
        stack.push_back({e.frame, info.function, r.has_arguments, r.arguments});
    }
    sink(r);
}

std::vector<std::string> CallNesting::close_lost(std::deque<OpenCall>& stack, const std::vector<LostExits>& lost) {
    std::vector<bool> closing(stack.size(), false);
    for (const LostExits& l : lost) {
        std::uint64_t left = l.count;
        for (std::size_t i = stack.size(); i-- > 0 && left > 0;)
            if (!closing[i] && (l.function.empty() || stack[i].function == l.function)) {
                closing[i] = true;
                left--;
            }
    }
    std::vector<std::string> closed;
    std::deque<OpenCall> open;
    for (std::size_t i = stack.size(); i-- > 0;)
        if (closing[i]) closed.push_back(std::move(stack[i].function));
    for (std::size_t i = 0; i < stack.size(); i++)
        if (!closing[i]) open.push_back(std::move(stack[i]));
    stack = std::move(open);
    return closed;
}

void write_function_stats_fields(JsonWriter& j, const FunctionStats& f) {
    j.field("name", f.function).field("calls", f.calls);
    // Only what the handlers kept: the others are absent, not 0.
    if (f.has_completed()) j.field("completed", f.completed);
    if (f.has_times())
        j.field("timed", f.timed)
            .field("inclusive_ns", f.inclusive_ns)
            .field("exclusive_ns", f.exclusive_ns)
            .field("mean_ns", f.timed ? f.inclusive_ns / f.timed : 0)
            .field("p50_ns", f.p50_ns)
            .field("p99_ns", f.p99_ns)
            .field("max_ns", f.max_ns);
    j.key("fields").begin_array().value("calls");
    if (f.has_completed()) j.value("completed");
    if (f.has_times()) j.value("times");
    j.end_array();
    j.field("live_ns", f.live_ns)
        .field("live_since_ns", f.live_since_ns)
        .field("window_start_ns", f.window_start_ns);
    if (f.conditioned) j.field("matched", f.raw.matched).field("undecided", f.raw.undecided);
    if (f.kind == probelist::ProbeKind::point) j.field("kind", "point");
}

std::vector<FunctionStats> merge_functions(const std::vector<std::vector<FunctionStats>>& per_process) {
    std::vector<FunctionStats> out;
    std::map<std::pair<std::string, probelist::ProbeKind>, std::size_t> index;
    for (const auto& rows : per_process)
        for (const FunctionStats& f : rows) {
            auto [it, fresh] = index.try_emplace({f.function, f.kind}, out.size());
            if (fresh) {
                out.push_back(f);
                continue;
            }
            FunctionStats& m = out[it->second];
            add(m.raw, f.raw);
            m.kept |= f.kept;
            ProbeState longest{IPROBE_RT_NO_STAT, m.live_since_ns != 0, m.live_ns, m.live_since_ns};
            keep_longest(longest, f.live_ns, f.live_since_ns);
            m.live_ns = longest.live_ns;
            m.live_since_ns = longest.live_since_ns;
            m.window_start_ns = std::min(m.window_start_ns, f.window_start_ns);
            m.conditioned = m.conditioned || f.conditioned;
            m.retval_histogram = m.retval_histogram || f.retval_histogram;
        }
    for (FunctionStats& f : out) fill_times(f);
    return out;
}

std::uint64_t TraceReader::unmatched_exits() const {
    const Region& region = impl_->region;
    std::uint64_t total = 0;
    for (std::uint32_t t = 0; t < region.thread_count(); t++) {
        const iprobe_rt_thread* slot = region.thread(t);
        if (region.touched(slot, sizeof *slot)) total += __atomic_load_n(&slot->unmatched_exits, __ATOMIC_RELAXED);
    }
    return total;
}

std::vector<ThreadDrops> TraceReader::drops_by_thread() const {
    const Region& region = impl_->region;
    std::vector<ThreadDrops> out;
    for (std::uint32_t i = 0; i < region.ring_count(); i++) {
        const iprobe_rt_ring* r = region.ring(i);
        if (!region.touched(r, sizeof *r)) continue;
        const std::uint64_t dropped = __atomic_load_n(&r->dropped, __ATOMIC_RELAXED);
        if (dropped) out.push_back({r->tid, dropped});
    }
    return out;
}

std::uint64_t TraceReader::dropped() const {
    const Region& region = impl_->region;
    std::uint64_t total = 0;
    for (std::uint32_t i = 0; i < region.ring_count(); i++) {
        const iprobe_rt_ring* r = region.ring(i);
        if (region.touched(r, sizeof *r)) total += __atomic_load_n(&r->dropped, __ATOMIC_RELAXED);
    }
    return total;
}

std::uint64_t TraceReader::take_dropped() {
    const Region& region = impl_->region;
    std::uint64_t total = 0;
    for (std::uint32_t i = 0; i < region.ring_count(); i++) {
        iprobe_rt_ring* r = region.ring(i);
        if (!region.touched(r, sizeof *r)) continue;
        const std::uint64_t now = __atomic_load_n(&r->dropped, __ATOMIC_RELAXED);
        total += minus(now, r->dropped_seen);
        r->dropped_seen = now;
    }
    return total;
}

std::uint64_t TraceReader::unhooked_returns() const {
    return __atomic_load_n(&impl_->region.control()->unhooked_returns, __ATOMIC_RELAXED);
}

std::uint64_t TraceReader::unhooked_pool_empty() const {
    return __atomic_load_n(&impl_->region.control()->unhooked_pool_empty, __ATOMIC_RELAXED);
}

std::uint64_t TraceReader::exits_lost_at_detach() const {
    return __atomic_load_n(&impl_->region.control()->exits_lost_at_detach, __ATOMIC_RELAXED);
}

std::uint64_t TraceReader::exit_marks_waiting() const { return impl_->exit_marks.calls(); }

std::uint64_t TraceReader::lost_events() const {
    const auto* cb = impl_->region.control();
    return cb->no_slot_events + cb->unknown_site_events;
}

double TraceReader::tsc_hz() const {
    const std::uint64_t hz = impl_->region.control()->tsc_hz;
    return static_cast<double>(hz ? hz : 1000000000ull);
}

pid_t TraceReader::pid() const { return impl_->pid; }

}  // namespace iprobe::hotpatch
