// Planning an attach while the target runs: which probe lists, which probes,
// which running module each belongs to, and its place in the region.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "iprobe/hotpatch/hotpatch.h"
#include "iprobe/probelist/probe_list.h"
#include "modules.h"
#include "patch.h"
#include "entry_sites.h"
#include "region.h"
#include "stubs.h"

namespace iprobe::hotpatch {

struct SelectedList {
    std::string source;
    probelist::ProbeList list;
    std::vector<const probelist::Probe*> selected;
    std::vector<const probelist::RefusedFunction*> refused;  // matched, but cannot be probed
    std::size_t exits_left_off = 0;  // matched exits the count handler does not need
    std::size_t exits_runtime_reads = 0;  // matched exits whose return V8 or HotSpot reads (left off, attach_plan.cpp)
    std::size_t exits_return_twice = 0;   // matched exits of setjmp, vfork and their kin (left off, attach_plan.cpp)
};

// The runtime's count handler counts calls from entries alone: exits are
// turned on only where asked for (AttachOptions::count_exits, --exit-only).
bool leaves_exits_off(const AttachOptions& options);

// What a probe of `kind` turned on with `mode` keeps (enum iprobe_rt_kept);
// no times where its exits are not stamped (--no-durations).
std::uint8_t kept_by(HandlerMode mode, std::uint8_t kind, bool exit_times);

std::string describe_selector(const probelist::ProbeSelector& s);

// Whether a module's file name `base` is what --module `name` names: the
// same, or `name` plus a version (libz: libz.so.1.2.13, libfoo-2.so).
bool module_named(const std::string& base, const std::string& name);

// The path (as the target sees it) of the one module of `pid` module_named
// `name`.
std::string module_source(pid_t pid, const std::string& name);

std::vector<SelectedList> load_lists(const AttachOptions& options);

std::string hex_id(const std::vector<std::uint8_t>& id);

const RunningModule& match_module(const SelectedList& s, const std::vector<RunningModule>& modules, pid_t pid);

// Aggregate slots for a new module's probes: one per function (its entry and
// exit probes share it), one per point.
void assign_stats(Region& region, const RunningModule& running, const probelist::ProbeList& list, std::uint32_t first_probe);

std::uint64_t realtime_ns();  // CLOCK_REALTIME, the clock of iprobe_rt_probe's live times

// Marks a probe on or off, keeping the time it has been live (a report says
// for which part of the window a function was counted).
void set_live(iprobe_rt_probe& probe, bool live, std::uint64_t now_ns);

// An entry probe is timed (pushes a frame) only while its function's exit
// probe is enabled too: nothing else would pop the frame; and only while
// that exit is stamped (its byte not IPROBE_RT_EXIT_UNSTAMPED, which the
// entry then takes: counted, no frame).
void update_timed(Region& region);

// Brings the probe table into this CPU's cache for writing, before the stop
// and again first thing in it: a stop's settings, live flags and timed bits
// touch one 64-byte line per probe, and 10k cold lines written one after the
// other cost ~0.35 ms of the pause; prefetched as one stream they cost a
// tenth of that, and nothing when still warm.
void warm_probes(const Region& region);

// Every site of the list lies inside the module's executable segments, so no
// write can land outside its code (the bytes at each selected site are
// checked once the world is stopped).
void check_sites_in_code(const SelectedList& s, const RunningModule& running);

// Throws Error(bad_input) unless the site holds its placeholder, a call into
// one of our stubs, or (call forms) the compiler's original hook call.
void check_site_bytes(const SelectedList& s, const RunningModule& running, const probelist::Probe& p, std::uint64_t site,
                      const std::uint8_t* now, StubChecker& stubs_seen);

// Which probes of a function-entry site (entry_sites.h) are on, read from
// its bytes `now`.  Throws Error(bad_input) as check_site_bytes() does for
// bytes that are neither, and Error(busy) for a site live through a stub
// that is not one of an entry site's (enabled by a handler without entry
// points for them): it must be detached first.
EntryVariant live_variant(const SelectedList& s, const RunningModule& running, const probelist::Probe& entry,
                          std::uint64_t site, const std::uint8_t* now, StubChecker& stubs_seen);

// A live entry site's stubs must be what this attach would write: another
// handler's (count against trace, fperf) cannot be rewritten while the site
// calls them.  Throws Error(busy) saying to detach first.
void require_same_stubs(const ProcessMemory& memory, const probelist::Probe& entry, std::uint64_t entry_slot,
                        std::uint64_t exit_slot, const EntrySiteStubs& stubs);

// What turning on `wanted` at one function-entry site takes (entry_sites.h):
// the stubs of its two slots, the site's new bytes (none when it serves them
// already) and which of its probes are on before and after.
struct EntrySitePlan {
    SiteStub entry_slot, exit_slot;
    std::optional<SiteStub> trampoline;  // a relocated entry's (relocated_entries.h)
    std::optional<Patch> patch;
    EntryVariant before, after;
};

struct EntrySiteHandlers {
    const HandlerSymbols& symbols;
    EntryTargets targets;                // the handler's entry points for the three variants
    std::int32_t inline_count_tpoff = 0; // count: the thread's sums (0: no inlined count)
};

// `id` is what the site's stubs pass; `now` the site's bytes.  Throws as
// live_variant() and require_same_stubs() do, and Error(unavailable) when the
// handler has no entry point for what would be on.
EntrySitePlan plan_entry_site(const SelectedList& s, const RunningModule& running, const iprobe_rt_module& module,
                              std::uint32_t entry_id, std::uint32_t id, EntryVariant wanted, const std::uint8_t* now,
                              const EntrySiteHandlers& handlers, const ProcessMemory& memory, StubChecker& stubs_seen);

// Before anything is injected or written: every selected site lies in the
// module's code and holds what the list says.
void check_selected_sites(const ProcessMemory& memory, const SelectedList& s, const RunningModule& running);

std::uint32_t find_or_add_module(Region& region, const RunningModule& running, const SelectedList& s);
// Its index in the region when attached before.
std::optional<std::uint32_t> find_module(const Region& region, const RunningModule& running, const SelectedList& s);

}  // namespace iprobe::hotpatch
