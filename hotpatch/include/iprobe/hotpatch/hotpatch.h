// Enable and disable probes in a running process (docs/design.md §4), and read the
// events its runtime logs into shared memory (§5).
//
// attach(): stop every thread (ptrace), check it is safe, inject the runtime
// (and a handler library) with dlopen if absent, create the shared-memory
// region, map a jump-stub page within ±2 GiB of each module, turn placeholder
// NOPs into `call stub` in one verified batch, resume.  Any failure restores
// everything already written and always detaches.
//
// Errors are iprobe::Error with the ExitCode the CLI returns: not_found (no
// such pid, module not loaded, glob matches nothing), permission, bad_input
// (not coldpatched, build-id mismatch), busy (another iprobe session),
// failure (target exited mid-way, unsafe state timed out).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "iprobe/support/fd.h"

#include "iprobe/probelist/probe_list.h"

namespace iprobe::hotpatch {

enum class HandlerMode { trace, count };

// Where enabled sites jump.  Symbols are dynamic symbols of `library`.
// Call-form sites (coldpatched calls) get C-ABI functions; NOP-form sites
// (LLVM pass, IPROBE_POINT_ARGS) need register-preserving entry points:
// leave those empty and attaching a NOP-form site is refused.
struct HandlerSymbols {
    std::string library;  // .so injected if not loaded; empty = the runtime
    std::string enter, exit, point;
    std::string enter_nop, exit_nop, point_nop;
    // Optional entry points for call-form sites reached through a per-site
    // stub, which passes the site's identity in edi: its global probe index
    // (SiteId::probe) or the byte offset of the counter it bumps in a
    // thread's sums (SiteId::counter: aggregate slot * record size + offset
    // of `calls` for entries, `completed` for exits).  Empty: the shared stub
    // and the C-ABI entry points above.
    enum class SiteId { probe, counter };
    std::string enter_id, exit_id;
    SiteId site_id = SiteId::probe;
    // Function-entry sites whose exits go through return trampolines (the
    // entry and LLVM flows: a NOP-form entry probe followed in the list by
    // the function's exit probe of form `ret`).  The site's own stub puts
    // the site id in r11d (SiteId: the counter of the function's `calls`, or
    // the entry probe's index, the exit's being the next): one entry point
    // per combination of the two probes enabled.  Empty entry_enter: the
    // site is served as a plain NOP-form entry (enter_nop); empty
    // entry_return / entry_enter_return: exits of such sites cannot be
    // enabled with this handler (the hooking entry point calls
    // iprobe_rt_hook_return; see runtime/include/iprobe/runtime/rt.h).
    std::string entry_enter, entry_return, entry_enter_return;

    static HandlerSymbols runtime(HandlerMode mode);  // the runtime's own handlers
};

// Probes chosen once by the caller: a probe list it loaded (from `source`,
// a path as the target sees it) and the ids of the probes it picked.  Handed
// to attach and detach instead of sources and a selector, so neither loads
// or matches again (a session turning functions on and off, fperf).
struct ProbeSelection {
    std::string source;
    std::shared_ptr<const probelist::ProbeList> list;
    std::vector<std::uint32_t> probes;  // ids (indices into list->probes)
};

// Loads `sources` and picks with `selector` (exactly what attach would):
// one selection per source, empty ones included.
std::vector<ProbeSelection> select_probes(const std::vector<std::string>& sources,
                                          const probelist::ProbeSelector& selector);

// What enabled function-entry probes record besides the call (issue 29):
// the arguments at entry, the return value at exit, the callers' return
// addresses.  Typed by the reader from DWARF; without it arg0..arg5 raw.
struct ValueOptions {
    bool args = false;
    bool retval = false;
    unsigned backtrace = 0;  // caller frames, 0 = none (at most IPROBE_RT_BACKTRACE_MAX)
    bool any() const { return args || retval || backtrace; }
    bool operator==(const ValueOptions&) const = default;
};

// The most thread slots `--max-threads` may ask for.
inline constexpr std::uint32_t kMaxThreadSlots = 65536;

struct AttachOptions {
    pid_t pid = 0;
    // Chosen already: when not empty, probe_sources, modules and selector
    // are not used.
    std::vector<ProbeSelection> selections;
    // Probe lists, coldpatched binaries or binaries with a probe section
    // (iprobe::load_probes), one per module; empty = the target's executable.
    std::vector<std::string> probe_sources;
    // Modules of the process by file name ("libz.so.1", or "libz" for
    // libz.so.*): each a source as if its mapped path were in probe_sources.
    std::vector<std::string> modules;
    probelist::ProbeSelector selector;
    HandlerMode mode = HandlerMode::trace;
    // The count handler turns entries on only (exits untouched: no return
    // trampoline, no return stack) unless this is set or the selector names
    // exit probes (--exit-only): then it also counts completed calls.
    bool count_exits = false;
    // The trace handler reads the clock at exits too (durations).  false
    // (--no-durations): one clock read a call, at its entry; its exit is
    // recorded in its place without a time (IPROBE_RT_EXIT_UNSTAMPED): the
    // calls' order, nesting and start times, completed counts, no durations.
    bool exit_times = true;
    ValueOptions values;                // trace handler only
    HandlerSymbols handlers;            // empty enter = HandlerSymbols::runtime(mode)
    std::string runtime_library;        // empty = default_runtime_library()
    // Per-thread event ring (trace stream), when the region is created:
    // 512 KiB, so 64 threads cost 32 MiB of rings, claimed as threads log.
    std::uint32_t ring_records = 1u << 14;
    // Thread slots (each a thread's sums) and rings, when the region is
    // created: threads beyond them at once are not in the sums (`lost`).
    std::uint32_t max_threads = 512;
    // ring_records or max_threads came from the user (--buffer,
    // --ring-records, --max-threads): a region made before with another
    // geometry is said to be kept (AttachStats::geometry_kept).
    bool geometry_given = false;
    std::chrono::milliseconds safe_point_timeout{3000};
    // `--when EXPR` and `--min-duration TIME` (condition.h): the trace
    // handler records a selected function's events only for calls they hold
    // for; every call is still counted.  Empty: every call is recorded.  Each
    // attach sets the selected functions' condition (none when empty).
    std::string when;
    std::string min_duration;
    // Keep a log2 histogram of each selected function's integer return value.
    bool retval_histogram = false;
    // Called between the two stops of an attach (AttachStats::prepare_pause_us),
    // the sites planned while the target ran, before the stop that writes
    // them: progress for a caller, and where a test interrupts an attach
    // (interrupt()) or changes the target between its stops.
    std::function<void()> between_stops;
};

struct AttachStats {
    std::size_t selected = 0;        // probes the selector matched
    std::size_t enabled = 0;         // newly enabled by this call
    std::size_t already_enabled = 0;
    std::size_t total_enabled = 0;   // enabled in the process after the call
    std::size_t threads = 0;         // threads stopped
    // The longest the target was stopped (first interrupt to last detach of
    // one stop): an attach stops it once, or twice (prepare_pause_us).
    std::uint64_t pause_us = 0;
    std::uint64_t stop_us = 0;       // of which: until every thread was stopped
    // A first attach stops the target twice: a short
    // preparation stop (the runtime injected, its region and the modules'
    // stub areas mapped), the sites planned while it runs again, then the
    // stop that checks and writes them.  Each stop's pause; prepare_pause_us
    // is 0 when there was no preparation stop (write_pause_us is then pause_us).
    std::uint64_t prepare_pause_us = 0;
    std::uint64_t write_pause_us = 0;
    bool runtime_injected = false;
    bool handler_injected = false;
    // The sites were planned while the target ran (the stop only checked and
    // wrote); false when the stop planned them (a first attach, or the files
    // mapped changed meanwhile).
    bool planned_while_running = false;
    // Functions of a binary nobody prepared that the selector matched but
    // that have no probe ('iprobe list FILE --refused' says why), and the
    // first of them with its reason.
    std::size_t refused = 0;
    std::string refused_example;
    std::vector<std::string> modules;  // module paths touched
    // Exit probes the selector matched that the count handler leaves off
    // (AttachOptions::count_exits).
    std::size_t exits_left_off = 0;
    // Exit probes the selector matched that are left off because the
    // runtime in the module (V8, HotSpot) reads their function's return
    // address walking its stack (attach_plan.cpp, kFrameWalkingRuntimes):
    // those calls are counted and traced from their entries.
    std::size_t exits_runtime_reads = 0;
    // Exit probes the selector matched that are left off because their
    // function returns twice or on another stack (setjmp, sigsetjmp, vfork,
    // getcontext, swapcontext, Boost.Context's switches: attach_plan.cpp,
    // kReturnsTwice): a hooked return there is taken again after its entry
    // was used.  Their calls are counted and traced from their entries.
    std::size_t exits_return_twice = 0;
    // Sites a forked child still ran from its probed parent, put back to
    // their bytes before this attach probed it as itself.
    std::size_t inherited_sites_restored = 0;
    // Selected functions left alone because `iprobe patch` replaced them
    // (their entry jumps to the replacement; see live_patch.h).
    std::vector<std::string> patched_skipped;
    // With ValueOptions: selected probes that record no values (developer
    // points; in the -finstrument-functions flow an entry without DWARF, an
    // entry hook in no function's code DWARF describes, or an exit whose
    // entry cannot hook the return), and probes typed without
    // DWARF (arg0..arg5 raw).
    std::size_t values_unavailable = 0;
    std::size_t values_untyped = 0;
    // -finstrument-functions flow: parameters not where the runtime can read
    // them at the site (shown as <optimized out>).
    std::size_t values_optimized_out = 0;
    // -finstrument-functions flow, with --retval: exit hooks of inlined
    // copies, which record the exit but no return value (a copy does not return).
    std::size_t values_no_return = 0;
    // With --when: inlined copies whose hook has a parameter it names
    // optimized out (their calls counted, none recorded).
    std::size_t when_undecidable = 0;
    // The region's geometry, set once by the attach that made it: each
    // thread's ring in records, and thread slots (threads beyond them are
    // not in the sums: `lost`).  geometry_kept: the user asked for another
    // (AttachOptions::geometry_given), which applies to a process's first
    // attach only.
    std::uint32_t ring_records = 0, thread_slots = 0;
    bool geometry_kept = false;
    bool operator==(const AttachStats&) const = default;
};

AttachStats attach(const AttachOptions& options);

struct DetachOptions {
    pid_t pid = 0;
    probelist::ProbeSelector selector;  // empty = every enabled probe
    // Chosen already (matched to the process's modules by build-id): when
    // not empty, only these probes, and the selector is not used.
    std::vector<ProbeSelection> selections;
    std::chrono::milliseconds safe_point_timeout{3000};
};

// Counts read back from the code after the change, not from bookkeeping.
struct DetachStats {
    std::size_t disabled = 0;       // sites turned from a live call back into their NOP
    std::size_t still_enabled = 0;  // sites of the process still holding a live call
    std::size_t not_restored = 0;   // of those, selected ones: detach failed for them
    std::size_t sites_restored = 0; // sites rewritten (from the probe lists and the code)
    // Calls in flight in the stop whose exit hook (a site of its own, the
    // -finstrument-functions flow) this detach turned off, their return not
    // hooked: their exits will never be recorded (the trace handler's timed
    // frames tell; the count handler keeps none, so its are not known).
    std::uint64_t exits_lost = 0;
    // Why the region was not used (the target rewrote it): detach needs
    // nothing from it, only its flags were left as they were.  Empty when sound.
    std::string region_problem;
    std::size_t threads = 0;
    std::uint64_t pause_us = 0;
    std::uint64_t stop_us = 0;
    bool operator==(const DetachStats&) const = default;
};

DetachStats detach(const DetachOptions& options);

struct ModuleStatus {
    std::string path, probes_path, build_id;
    std::uint64_t load_bias = 0, stub_page = 0;
    std::uint32_t probes = 0, enabled = 0;  // enabled: the region's bookkeeping
    // Read from the code: sites holding a call into our stubs (-1: the code
    // or the probe list could not be read, see Status::sites_unread), and
    // sites holding neither that nor their NOP (another tool's patch?).
    std::int64_t live = -1;
    std::uint32_t foreign = 0;
    // What its sites are: "relocated" (a binary nobody prepared: entries
    // moved into trampolines), "pad" (built with iprobe-cc: the flow's
    // NOPs) or "pad+relocated" (the entry flow's functions without a pad
    // relocated); empty when its probe list could not be read.
    std::string sites;
    std::string flow;  // probelist::flow_name of its list
};

struct RingStatus {
    std::uint32_t index = 0, tid = 0;
    std::string state;  // owned | retired
    std::uint64_t pending = 0, dropped = 0;
};

struct Status {
    pid_t pid = 0;
    bool runtime_loaded = false;
    std::string runtime_path;
    bool region = false;  // the process has an iprobe region
    std::uint64_t region_bytes = 0;  // its (sparse) size
    std::uint32_t threads = 0;       // thread slots used (by live or exited threads)
    std::vector<ModuleStatus> modules;
    std::vector<RingStatus> rings;
    std::uint64_t dropped = 0, no_ring_events = 0, no_slot_events = 0, unknown_site_events = 0;
    std::uint64_t unhooked_returns = 0;     // calls whose exit could not be hooked
    std::uint64_t unhooked_pool_empty = 0;  // of those, the thread found the return pool taken by others
    std::uint32_t ring_records = 0, ring_count = 0;
    std::string sites_unread;  // why the code's live sites could not be read, if so
    // A child forked from a probed process (no region of its own): its
    // parent, the sites it still runs from it (`modules` lists their
    // modules), and the events those dropped.
    pid_t forked_from = 0;
    std::uint64_t inherited_live = 0;
    std::uint64_t fork_child_events = 0;
};

Status status(pid_t pid);
// The region's part of a status (modules, rings, threads, counters) from a
// descriptor of it: what the fuzzer drives (tests/fuzz/harness/region.cpp).
Status region_status(UniqueFd region_fd);

// Makes an attach or detach in progress stop at its next wait, undo what it
// did, let the target go and throw Error(ExitCode::interrupted); a call made
// later throws at once.  Async-signal-safe: for SIGINT/SIGTERM handlers.
void interrupt() noexcept;
bool interrupted() noexcept;

// libiprobe-rt.so next to this program's build/install tree, or $IPROBE_RUNTIME.
std::string default_runtime_library();

}  // namespace iprobe::hotpatch
