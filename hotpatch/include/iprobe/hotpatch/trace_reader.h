// Reads what a process's runtime keeps in its iprobe region from outside,
// while the writers are live (and after the process exited, for as long as
// the reader holds the region): the per-function aggregates, summed over the
// threads' slots, and the per-thread event stream, symbolized from the probe
// lists the attacher recorded.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "iprobe/hotpatch/exit_marks.h"
#include "iprobe/probelist/probe_list.h"
#include "iprobe/formats/rt_layout.h"
#include "iprobe/support/fd.h"

namespace iprobe {
class JsonWriter;
}

namespace iprobe::hotpatch {

// A value an event carries (`attach --args --retval`), typed by the reader.
struct Value {
    std::string name;  // parameter name, arg0..arg5 without DWARF; empty for a return value
    std::string type;  // as C spells it
    std::string text;  // as `trace --format text` prints it: 10, RED, "key", NULL, {x = 1, y = 2}
    std::string json;  // the same as a JSON value
    bool operator==(const Value&) const = default;
};

// A caller in a backtrace (`attach --backtrace`), nearest first.
struct Frame {
    std::uint64_t address = 0;  // return address
    std::string function;       // empty when no module names it
    std::string file;
    std::uint32_t line = 0;
    bool operator==(const Frame&) const = default;
};

// Calls of one function a detach left without their exits (an exit mark,
// exit_marks.h), as the event after the mark carries them.
struct LostExits {
    std::string function;     // empty: the mark names more than one (coalesced): the innermost calls
    std::uint64_t count = 0;
    std::uint64_t at_ns = 0;  // the detach, CLOCK_REALTIME
    bool operator==(const LostExits&) const = default;
};

struct Event {
    std::uint64_t tsc = 0;
    std::uint64_t time_ns = 0;  // CLOCK_REALTIME nanoseconds
    // false: an exit recorded without its time (attach --no-durations,
    // IPROBE_RT_NO_TIME): tsc and time_ns are 0.
    bool stamped = true;
    std::uint32_t probe = 0;    // global probe index
    std::uint32_t tid = 0;
    probelist::ProbeKind kind = probelist::ProbeKind::entry;
    std::uint16_t depth = 0;    // handler nesting (signal re-entrancy)
    std::uint8_t nargs = 0;     // POINT events
    std::uint64_t args[4] = {0, 0, 0, 0};
    // Function-entry sites: the function's return-address slot (0 elsewhere):
    // an exit pairs with the entry of the same frame; an open frame below a
    // later event's was unwound (an exception, longjmp): it has no exit.
    std::uint64_t frame = 0;
    // An inlined copy's entry (IPROBE_RT_VALUES_COPY): `frame` is its host's,
    // so it nests in the call open there instead of ending it.
    bool inlined_copy = false;
    // An entry whose call's exit is not traced (none of its function's exits
    // on: attach --entry-only): it opens no call.  See entry_without_exit.
    bool exit_traced = true;
    // Events of this thread its ring dropped just before this one (it was
    // full: IPROBE_RT_REC_GAP); the calls open before them may have ended.
    std::uint64_t dropped_before = 0;
    // Calls of this thread in flight at a detach that turned their exit
    // hooks off (-finstrument-functions flow): their exits never come.
    std::vector<LostExits> exits_lost_before;
    bool has_values = false;         // entry: args recorded; exit: the return registers
    std::vector<Value> values;       // entry: the arguments
    std::optional<Value> retval;     // exit: nullopt for void (or not recorded)
    std::vector<Frame> backtrace;
};

// How the runtime records an entry whose call's exit is not traced
// (rt_layout.h, IPROBE_RT_REC_POINT): as a point at the entry probe, or, with
// values, an entry whose record spec has IPROBE_RT_VALUES_NO_EXIT.  Makes
// either an entry with `exit_traced` false; `probe_kind` is the kind of
// `e.probe` in its probe table, `spec` the record's values spec (0 without).
inline void entry_without_exit(Event& e, probelist::ProbeKind probe_kind, std::uint32_t spec) {
    if (e.kind == probelist::ProbeKind::point && probe_kind == probelist::ProbeKind::entry) {
        e.kind = probelist::ProbeKind::entry;
        e.exit_traced = false;
    } else if (e.kind == probelist::ProbeKind::entry && (spec & IPROBE_RT_VALUES_NO_EXIT)) {
        e.exit_traced = false;
    }
}

// An exit recorded without its time (attach --no-durations: the runtime did
// not read its clock, rt_layout.h, IPROBE_RT_NO_TIME): the readers give it
// no time and leave their clock where it was.
inline bool exit_without_time(const iprobe_rt_record& r) {
    return r.tsc == IPROBE_RT_NO_TIME && r.kind == IPROBE_RT_REC_EXIT;
}

// A GAP record's count until the next event of the thread (or ring) that
// wrote it (rt_layout.h, IPROBE_RT_REC_GAP): two in a row add up (the event
// after the first was dropped too); another owner's GAP replaces it.
class PendingGap {
public:
    void add(std::uint32_t owner, std::uint64_t dropped) {
        count_ = (owner == owner_ ? count_ : 0) + dropped;
        owner_ = owner;
    }
    // What `owner`'s next event was preceded by: its dropped_before.
    std::uint64_t take(std::uint32_t owner) { return count_ && owner == owner_ ? std::exchange(count_, 0) : 0; }

private:
    std::uint64_t count_ = 0;
    std::uint32_t owner_ = UINT32_MAX;
};

struct ProbeInfo {
    std::string function;  // demangled
    std::string symbol;    // raw (what a selector matches without quoting)
    std::string file;
    std::uint32_t line = 0;
    probelist::ProbeKind kind = probelist::ProbeKind::entry;
    std::string module;
};

// One event of the trace stream, symbolized, with its nesting in its
// thread (what `iprobe trace --format json` prints a line of,
// and a probe agent sends: agent_protocol.h).
struct TraceRecord {
    std::uint64_t time_ns = 0;  // CLOCK_REALTIME; not stamped: the last its thread had before it
    std::uint32_t tid = 0;
    probelist::ProbeKind kind = probelist::ProbeKind::entry;
    std::string function;       // demangled
    int depth = 0;              // calls of this thread open around it
    std::vector<std::uint64_t> args;  // a point's arguments
    bool in_signal = false;     // logged by a signal handler that interrupted the thread
    // false: an exit recorded without its time (attach --no-durations): the
    // call ended at or after time_ns, the latest time its thread had before it.
    bool stamped = true;
    // attach --args: an entry's arguments; at an exit, those of the call it
    // ends (for "<- f(n=10) = 55"; not in JSON).
    bool has_arguments = false;
    std::vector<Value> arguments{};
    std::optional<Value> retval{};  // attach --retval: an exit's (nullopt for void)
    std::vector<Frame> backtrace{};  // attach --backtrace, nearest caller first
    // An exit nobody saw: the call's frame was unwound (an exception,
    // longjmp), found when a later event of its thread sat at or above it.
    bool unwound = false;
    // An entry whose call's exit is not traced (attach --entry-only): it
    // opens no call, so what follows stays at its depth.
    bool exit_traced = true;
    // Events of this thread dropped just before this one (its ring was
    // full): the nesting starts afresh here.
    std::uint64_t dropped_before = 0;
    // Calls of this thread in flight at a detach before this event that
    // lost their exit (the detach turned their exit hooks off): the
    // nesting closed those open (`exits_closed`, innermost first) at the
    // detach's instant `exits_lost_ns`.
    std::uint64_t exits_lost_before = 0;
    std::vector<std::string> exits_closed{};
    std::uint64_t exits_lost_ns = 0;
    bool operator==(const TraceRecord&) const = default;
};
// The nesting of each thread's calls as events come (the tids come from
// the target's rings, so the table is bounded: past 65536 threads it starts
// over; indentation stops growing past 256 calls).
class CallNesting {
public:
    // The records `event` makes, in order: the calls its thread had open
    // that its frame shows were unwound (exits with `unwound`), then its own.
    void records(const Event& event, const ProbeInfo& info, const std::function<void(const TraceRecord&)>& sink);

private:
    struct OpenCall {
        std::uint64_t frame = 0;  // its return slot, 0 when unknown
        std::string function;
        bool has_arguments = false;
        std::vector<Value> arguments;
    };
    // A deque: past kMaxOpen open calls the oldest goes, at O(1) per event.
    std::unordered_map<std::uint32_t, std::deque<OpenCall>> stacks_;
    // Each thread's latest time: where an exit without its own (not stamped) is put.
    std::unordered_map<std::uint32_t, std::uint64_t> last_ns_;
    // Closes the open calls `lost` names (the innermost of each function
    // first); returns their functions, innermost first.
    static std::vector<std::string> close_lost(std::deque<OpenCall>& stack, const std::vector<LostExits>& lost);
};

// One function's aggregates (ticks converted to ns).
struct FunctionStats {
    std::uint32_t stat = 0;  // aggregate slot
    std::string function;
    std::string symbol;      // raw
    probelist::ProbeKind kind = probelist::ProbeKind::entry;  // point: a point probe's hits
    std::uint64_t calls = 0, completed = 0, timed = 0;
    std::uint64_t inclusive_ns = 0, exclusive_ns = 0, max_ns = 0;
    std::uint64_t p50_ns = 0, p99_ns = 0;
    // When its probes were on: counts cover only that part of the time since
    // the process's first attach.  Kept as instants (CLOCK_REALTIME ns), so
    // two reads of an unchanged process agree.
    std::uint64_t live_ns = 0;          // finished stretches with its probes on
    std::uint64_t live_since_ns = 0;    // on since then (0: off now)
    std::uint64_t window_start_ns = 0;  // the process's first attach
    std::uint64_t probed_ns(std::uint64_t now_ns) const {
        return live_ns + (live_since_ns && now_ns > live_since_ns ? now_ns - live_since_ns : 0);
    }
    // What its handlers kept (enum iprobe_rt_kept): a field they did not
    // keep is absent from a report, never shown as 0 or estimated.
    std::uint8_t kept = IPROBE_RT_KEPT_CALLS | IPROBE_RT_KEPT_COMPLETED | IPROBE_RT_KEPT_TIMES;
    bool has_completed() const { return kept & IPROBE_RT_KEPT_COMPLETED; }
    bool has_times() const {
        constexpr std::uint8_t all = IPROBE_RT_KEPT_CALLS | IPROBE_RT_KEPT_COMPLETED | IPROBE_RT_KEPT_TIMES;
        return (kept & all) == all;
    }
    // A `--when`/`--min-duration` condition is (or was) on: raw.matched
    // counts the calls it held for (their events recorded).
    bool conditioned = false;
    bool retval_histogram = false;  // raw.retval_histogram is kept (attach --retval)
    iprobe_rt_fn_stats raw{};  // the sums these were made from, in clock ticks
    double ns_per_tick = 1;
};

// One function's fields in JSON (`iprobe report --json`, a debug session's
// report): inside an object the caller opens.
void write_function_stats_fields(JsonWriter& json, const FunctionStats& f);

// Rows of several processes merged by function and kind (the clones of one
// debug session, each probing its share of the functions): counts and times
// add up, max is the largest, quantiles come from the summed histograms, the
// longest probed time and the earliest window start are kept.  The
// processes share one clock (one host).
std::vector<FunctionStats> merge_functions(const std::vector<std::vector<FunctionStats>>& per_process);

// A probe's state in the region.
struct ProbeState {
    std::uint32_t stat = IPROBE_RT_NO_STAT;  // aggregate slot
    bool live = false;                       // the site holds its call now
    std::uint64_t live_ns = 0;               // finished stretches it was live
    std::uint64_t live_since_ns = 0;         // CLOCK_REALTIME since when it is live (0: off)
    std::uint16_t condition = 0;             // iprobe_rt_probe.condition (entry probes)
    bool retval_hist = false;                // the return value's histogram is kept (exit probes)
    std::uint8_t kept = 0;                   // enum iprobe_rt_kept (0: not recorded)
};

// Raw records of one ring, published and in written pages: indices
// [from, to) of records[index & mask].  `last`: `to` is what the ring had
// published (a POINT's argument record cannot follow in a later run).
struct RecordRun {
    const iprobe_rt_record* records = nullptr;
    std::uint64_t mask = 0, from = 0, to = 0;
    bool last = false;
    std::uint32_t ring = 0;
};

// Region clock ticks to CLOCK_REALTIME ns (saturating, never wrapping).
struct WallClock {
    std::uint64_t tsc_base = 0, realtime_base = 0;
    double ns_per_tick = 1;
    std::uint64_t ns(std::uint64_t tsc) const;
};

class ValueTypes;  // values_reader.h: what typing a values event's words takes

struct ThreadDrops {
    std::uint32_t tid = 0;
    std::uint64_t dropped = 0;  // records lost because the ring was full
};

class TraceReader {
public:
    // aggregates: report and status (any number at once, nothing consumed);
    // stream: the one consumer of the event rings (a lock keeps it alone).
    enum class Access { aggregates, stream };

    // Throws Error(not_found) when the process has no region (never attached).
    explicit TraceReader(pid_t pid, Access access = Access::stream);
    // A region handed over as a descriptor (a memfd, checked like any
    // region): the caller keeps a stream reader alone.  pid() is 0.
    TraceReader(UniqueFd region, Access access);
    ~TraceReader();
    TraceReader(const TraceReader&) = delete;
    TraceReader& operator=(const TraceReader&) = delete;

    // Consumes every published record of every ring, oldest first per thread
    // (Access::stream only).
    std::size_t drain(const std::function<void(const Event&)>& sink);
    // The same, as runs of raw records (a writer's bulk copy); returns the
    // records consumed.  Exit marks of a detach (exit_marks.h) go to
    // `marks` before any record of their thread recorded after them.
    std::size_t drain_runs(const std::function<void(const RecordRun&)>& sink,
                           const std::function<void(const ExitMark&)>& marks = {});
    // What drain() does with each run: its events to `sink` (an event whose
    // records go on in the ring's next run waits for it); decode_end() ends
    // the one still open.  So a writer of the runs (trace --output) and a
    // live printer see the same events.  Returns the events given.
    std::size_t decode(const RecordRun& run, const std::function<void(const Event&)>& sink);
    std::size_t decode_end(const std::function<void(const Event&)>& sink);
    // How the values records of this process are typed (for a trace file
    // that keeps what it needs to type them later).
    ValueTypes& value_types();
    WallClock wall_clock() const;

    // Probe metadata by global index (re-reads the module table when it grew).
    const ProbeInfo& probe(std::uint32_t index);
    const std::vector<ProbeInfo>& probes();  // every probe known now, by global index
    std::uint32_t probe_count() const;
    // By global index.
    std::vector<ProbeState> probe_states() const;
    // CLOCK_REALTIME ns when the region was made (the first attach).
    std::uint64_t window_start_ns() const;

    // Sums over every thread slot, per function, now.
    std::vector<iprobe_rt_fn_stats> sums() const;
    // The sums marked by the last mark_baseline() (zero when never marked).
    std::vector<iprobe_rt_fn_stats> baseline() const;
    void mark_baseline(const std::vector<iprobe_rt_fn_stats>& sums);
    // `sums` (minus `since`, when given) per function that was called, named.
    std::vector<FunctionStats> functions(const std::vector<iprobe_rt_fn_stats>& sums,
                                         const std::vector<iprobe_rt_fn_stats>* since = nullptr);
    std::uint64_t unmatched_exits() const;  // exits whose entry came before the attach
    // Calls whose return could not be hooked (deeper than a thread's return
    // stack, the pool exhausted): their exits are missing from `completed`.
    std::uint64_t unhooked_returns() const;
    // Of those, calls whose thread found every chunk of the runtime's return
    // pool held by other threads (more than IPROBE_RT_RETURN_POOL_THREADS).
    std::uint64_t unhooked_pool_empty() const;
    // Calls in flight when a detach turned their exit hooks off (iprobe_rt_control).
    std::uint64_t exits_lost_at_detach() const;
    // Of those, the ones whose marks decode() has not given to an event yet
    // (their threads made none after the detach).
    std::uint64_t exit_marks_waiting() const;

    // Lossless (Access::stream only): while on, a thread whose ring is full
    // waits for this reader instead of dropping (the default is lossy and
    // counted).  The destructor turns it off; a reader killed before that
    // leaves at most one bounded wait (IPROBE_RT_LOSSLESS_WAIT_S), after
    // which the runtime turns it off itself, counted in lossless_timeouts().
    void set_lossless(bool on);
    bool lossless() const;
    std::uint64_t lossless_timeouts() const;
    // How long to wait before draining again after a drain that consumed
    // `drained` records.  Lossy: not at all while records flow, 5 ms once
    // the rings are empty.  Lossless: threads may wait on a full ring, so
    // soon; but not straight after a small drain, which reads each line
    // just behind the threads writing it (every line crossing between the
    // cores twice): a batch (a quarter of the default ring) gathers first.
    std::chrono::microseconds pause_after(std::size_t drained) const;

    // Event-stream drops (full rings), per thread and in all; never in the sums.
    std::vector<ThreadDrops> drops_by_thread() const;
    std::uint64_t dropped() const;                // since the first attach
    std::uint64_t take_dropped();                 // not yet reported by a trace, and marks them
    std::uint64_t lost_events() const;            // no slot / unknown site (cumulative)
    double tsc_hz() const;
    pid_t pid() const;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace iprobe::hotpatch
