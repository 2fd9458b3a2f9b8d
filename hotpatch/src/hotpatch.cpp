// attach, detach and status: each plans while the target runs, then stops the
// world once (session.h), injects what is missing (inject.h) and writes the
// sites (patch.h).
#include "iprobe/hotpatch/hotpatch.h"

#include <signal.h>
#include <sys/mman.h>
#include <time.h>

#include <algorithm>
#include <array>
#include <functional>
#include <optional>
#include <map>
#include <set>

#include "attach_plan.h"
#include "entry_sites.h"
#include "inject.h"
#include "live_sites.h"
#include "modules.h"
#include "patch.h"
#include "redirects.h"
#include "iprobe/hotpatch/exit_marks.h"
#include "iprobe/hotpatch/live_patch.h"
#include "attach_conditions.h"
#include "process.h"
#include "region.h"
#include "iprobe/probelist/symbol_probes.h"
#include "relocated_entries.h"
#include "seccomp_check.h"
#include "session.h"
#include "values_plan.h"
#include "stubs.h"
#include "iprobe/runtime/rt.h"
#include "iprobe/support/error.h"

namespace iprobe::hotpatch {

namespace {

// detach() once the session's lock is held (attach uses it too).
DetachStats detach_locked(const DetachOptions& options);

// A site this attach turns on: its probe's flag and its key in the site hash.
struct Enable {
    std::uint32_t global;          // the probe to flag enabled
    std::uint64_t return_address;  // its site's key in the site hash
    std::uint32_t keyed;           // the probe that key resolves to
};

// Everything an attach writes, worked out from the code as it is.
struct SitesPlan {
    std::vector<Patch> patches;
    std::vector<SiteStub> site_stubs;
    std::vector<Enable> enables;
    std::set<std::string> touched;
    std::size_t selected = 0, newly_enabled = 0, already_enabled = 0;
    std::vector<std::uint32_t> first_probes;  // per list: its module's probe 0 in the region
};

// What the attach sets on its probes besides turning them on: `--when`
// programs, the return-value histogram, the values captured, whether its
// exits are stamped.
struct ProbeSettings {
    const ConditionPlan& conditions;
    const std::vector<ValuesPlan>& values;  // per list
    std::uint8_t exit_stamp = 0;            // its exit probes' timed byte: IPROBE_RT_EXIT_UNSTAMPED or 0
};

// Where a module's region entry and stub areas come from: added and mapped
// (remote calls: the world stopped), or, planning while the target runs,
// only found (NeedsStop when missing).
struct StubAreas {
    std::function<std::uint32_t(Region&, const RunningModule&, const SelectedList&)> module;
    std::function<void(const RunningModule&, iprobe_rt_module&)> page;
    std::function<void(const RunningModule&, iprobe_rt_module&, std::uint32_t)> site_stubs;
    std::function<std::uint64_t(iprobe_rt_module&, std::uint64_t)> shared_stub;
    // Whether a call whose return was hooked to record exit probe `exit`
    // (global) may still be in flight: read in the stop.
    std::function<bool(std::uint32_t)> hooked_in_flight;
};
struct NeedsStop {};

// -finstrument-functions sites with values (values_plan.h): the entry's
// stub goes to the entry point that lays out the registers for its recipe,
// which rides in the stub's slot; an exit its entry's hooked return records
// goes to a checked exit (its recipe in its slot too), which records only
// the calls whose return the entry did not hook.  Attached again without
// values (or re-enabled after a detach), an exit stays checked (the count
// handler's when it counts) while a call hooked earlier may still be in
// flight, its trampoline in its slot (hooked_exits_in_flight).  An inlined
// copy's exit under a --when goes to one that decides from its entry's frame.
const std::string kSiteValuesEntry = "iprobe_rt_trace_enter_id_regs";
const std::string kSilentExit = "iprobe_rt_site_exit_checked";
const std::string kSilentExitCount = "iprobe_rt_site_exit_checked_count";
const std::string kDecidingExit = "iprobe_rt_copy_exit_id";
constexpr std::uint8_t kMovEdi = 0xbf;  // a site's own stub begins `mov $id, %edi` (stubs.h)

// The exit probes (global ids) that calls whose return a
// -finstrument-functions entry hooked will record, with how many such
// calls: the trace handler's held entries of the runtime's return pool
// whose slot still holds their trampoline (return_stack.h; read in the stop).  An entry whose slot is
// not written yet is left out: that entry re-reads its spec after writing
// it and, values gone, gives the exit back to the hooks (rt.c).  nullopt
// when the pool cannot be read (a stripped runtime): then every one may be.
std::optional<std::map<std::uint32_t, std::uint64_t>> hooked_exits_in_flight(const ProcessMemory& memory,
                                                                             const LoadedLibrary& runtime) {
    struct ReturnEntry {  // struct iprobe_rt_return (runtime/src/return_stack.h)
        std::uint64_t ret, slot;
        std::uint32_t handler, arg;
        std::uint64_t cookie;
    };
    static_assert(sizeof(ReturnEntry) == 32);
    constexpr std::size_t kEntries = 32768;     // IPROBE_RT_RETURN_ENTRIES
    constexpr std::uint64_t kUnitSize = 32, kTrampoline = 4, kTraceHandler = 2;
    const auto pool = runtime.symbol("iprobe_rt_return_pool"), sled = runtime.symbol("iprobe_rt_return_sled");
    if (!pool || !sled) return std::nullopt;
    std::vector<ReturnEntry> entries(kEntries);
    try {
        memory.read(*pool, entries.data(), entries.size() * sizeof(ReturnEntry));
    } catch (const Error&) {
        return std::nullopt;
    }
    std::map<std::uint32_t, std::uint64_t> out;  // exit probe -> its hooked calls in flight
    for (std::size_t i = 0; i < entries.size(); i++) {
        const ReturnEntry& e = entries[i];
        if (!e.ret || e.handler != kTraceHandler) continue;
        std::uint64_t held = 0;
        try {
            memory.read(e.slot, &held, sizeof held);
        } catch (const Error&) {
            continue;  // its stack is gone
        }
        if (held == *sled + i * kUnitSize + kTrampoline) out[e.arg]++;
    }
    return out;
}

// Calls in flight (in the stop) whose exit is one of `exits` (global exit
// probes at sites of their own, being turned off) and whose return is not
// hooked: their exits will never be recorded.  The trace handler pushes a
// timed frame for each call of such a function (its stat) that its exit
// hook, or its hooked return, pops; calls with a hooked return are recorded
// by their trampoline.  The lost ones' frames, the most recent first, are
// marked abandoned so that no later exit is timed against them and the next
// detach does not count them again.  Thread slots not owned are threads gone.
// `marked` gets the thread slot and function (stat) of each frame marked.
std::uint64_t abandon_exits_in_flight(Region& region, const std::vector<std::uint32_t>& exits,
                                      const std::function<std::optional<std::map<std::uint32_t, std::uint64_t>>()>& hooked,
                                      std::vector<std::pair<std::uint32_t, std::uint32_t>>& marked) {
    if (exits.empty()) return 0;
    std::set<std::uint32_t> stats;
    for (std::uint32_t g : exits)
        if (g < region.probe_count()) stats.insert(region.probes()[g].stat);
    std::vector<iprobe_rt_frame*> frames;
    std::vector<std::uint32_t> slots;  // each frame's
    for (std::uint32_t t = 0; t < region.thread_count(); t++) {
        iprobe_rt_thread* slot = region.thread(t);
        if (!region.touched(slot, sizeof *slot) ||
            __atomic_load_n(&slot->state, __ATOMIC_RELAXED) != IPROBE_RT_RING_OWNED)
            continue;
        const std::uint32_t depth = std::min<std::uint32_t>(slot->depth, IPROBE_RT_STACK_DEPTH);
        for (std::uint32_t d = depth; d-- > 0;)
            if (stats.count(slot->stack[d].stat)) {
                frames.push_back(&slot->stack[d]);
                slots.push_back(t);
            }
    }
    if (frames.empty()) return 0;
    std::uint64_t recorded = 0;
    if (const auto in_flight = hooked())
        for (std::uint32_t g : exits)
            if (const auto it = in_flight->find(g); it != in_flight->end()) recorded += it->second;
    const std::uint64_t lost = frames.size() > recorded ? frames.size() - recorded : 0;
    for (std::uint64_t i = 0; i < lost; i++) {
        marked.emplace_back(slots[i], frames[i]->stat);
        frames[i]->stat = IPROBE_RT_FRAME_ABANDONED;
    }
    return lost;
}

// The region's clock now (iprobe_rt_control.clock): in the stop, after the
// clock of every event the stopped threads recorded or are recording, and
// before that of any event they record once let go.
std::uint64_t region_clock_now(const Region& region) {
    if (region.control()->clock != IPROBE_RT_CLOCK_MONOTONIC) return __builtin_ia32_rdtsc();
    timespec ts{};
    ::clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

// Says in each thread's stream where its calls in `marked` (thread slot,
// function) lost their exits: a mark per thread and function, at `stopped_at`
// (exit_marks.h), which the trace reader closes them at.  `exits`: the exit
// probes turned off, one of which names each function.
void mark_exits_lost(Region& region, const std::vector<std::uint32_t>& exits,
                     const std::vector<std::pair<std::uint32_t, std::uint32_t>>& marked, std::uint64_t stopped_at) {
    if (marked.empty() || !region.exit_marks(0)) return;
    std::map<std::uint32_t, std::uint32_t> exit_of;  // stat -> an exit probe of it
    for (std::uint32_t g : exits)
        if (g < region.probe_count()) exit_of.try_emplace(region.probes()[g].stat, g);
    std::map<std::uint32_t, std::map<std::uint32_t, std::uint64_t>> lost;  // slot -> stat -> calls
    for (const auto& [slot, stat] : marked) lost[slot][stat]++;
    std::uint64_t written = 0;
    for (const auto& [slot, by_stat] : lost) {
        const std::uint32_t tid = __atomic_load_n(&region.thread(slot)->tid, __ATOMIC_RELAXED);
        std::vector<ExitMark> marks;
        for (const auto& [stat, calls] : by_stat) {
            const auto it = exit_of.find(stat);
            marks.push_back({tid, it == exit_of.end() ? IPROBE_RT_EXIT_MARK_ANY : it->second, stopped_at, calls});
        }
        add_exit_marks(*region.exit_marks(slot), marks);
        written += marks.size();
    }
    __atomic_fetch_add(&region.control()->exit_marks_written, written, __ATOMIC_RELEASE);
}

// An entry turned off with its exit hook by this detach stays timed: a
// thread already past its site in the stop (inside the handler) then finds
// it timed but off, and counts its exit lost (rt.c, FRAME_EXIT_HOOK) rather
// than entering untimed without a word.  The next attach recomputes it.
void keep_timed_while_racing(Region& region, const std::vector<std::uint32_t>& exits_off,
                             const std::vector<std::uint32_t>& probes_off) {
    // In the stop: nothing to build where no exit of its own goes off (the
    // entry flow's), and a sorted copy, not a tree of 10k nodes, where one does.
    if (exits_off.empty()) return;
    std::vector<std::uint32_t> off(probes_off);
    std::sort(off.begin(), off.end());
    iprobe_rt_probe* probes = region.probes();
    for (std::uint32_t exit : exits_off)
        if (exit > 0 && exit < region.probe_count() && std::binary_search(off.begin(), off.end(), exit - 1) &&
            probes[exit - 1].kind == static_cast<std::uint8_t>(probelist::ProbeKind::entry) &&
            probes[exit - 1].stat == probes[exit].stat)
            probes[exit - 1].timed = 1;
}

SitesPlan plan_sites(const ProcessMemory& memory, Region& region, std::vector<SelectedList>& lists,
                     const std::vector<const RunningModule*>& targets, const HandlerSymbols& handlers,
                     const LoadedLibrary& handler_lib, std::int64_t stats_tpoff, const StubAreas& areas,
                     const std::vector<ValuesPlan>& values) {
    SitesPlan plan;
    auto& [patches, site_stubs, enables, touched, selected, newly_enabled, already_enabled, first_probes] = plan;
    StubChecker stubs_seen(memory);
    std::map<const std::string*, std::uint64_t> handler_addresses;  // keyed as `stubs` below
    // Where kSiteValuesEntry, kSilentExit, kSilentExitCount and kDecidingExit are in the handler library (0: not there).
    const std::uint64_t site_values_entry = handler_lib.symbol(kSiteValuesEntry).value_or(0);
    const std::uint64_t deciding_exit = handler_lib.symbol(kDecidingExit).value_or(0);
    const std::pair<std::uint64_t, std::uint64_t> checked_exits{handler_lib.symbol(kSilentExit).value_or(0),
                                                                handler_lib.symbol(kSilentExitCount).value_or(0)};

    for (std::size_t li = 0; li < lists.size(); li++) {
        auto& s = lists[li];
        const RunningModule& running = *targets[li];
        const std::uint32_t mi = areas.module(region, running, s);
        iprobe_rt_module& module = region.modules()[mi];
        touched.insert(running.path);
        first_probes.push_back(module.first_probe);
        if (s.selected.empty()) continue;
        const std::uint32_t stub_slots = site_stub_slots_for(s.list);  // a scan of the list: once, not per site
        std::vector<std::uint64_t> addresses;
        addresses.reserve(s.selected.size());
        for (const probelist::Probe* p : s.selected) addresses.push_back(running.load_bias + p->site);
        const std::vector<SiteText> text = read_sites(memory, addresses);
        areas.page(running, module);
        // Keyed by the handler symbol's identity: one of the six in `handlers`.
        std::map<const std::string*, std::uint64_t> stubs;
        // Looked up once per symbol, not once per site: a symbol search
        // is a scan of the library's table, 10k of them a millisecond.
        auto handler_address = [&](const std::string& symbol) {
            auto& known = handler_addresses[&symbol];
            if (known) return known;
            const auto target = handler_lib.symbol(symbol);
            if (!target) throw Error(handler_lib.path + " has no symbol " + symbol, ExitCode::bad_input);
            return known = *target;
        };
        patches.reserve(patches.size() + s.selected.size());
        site_stubs.reserve(site_stubs.size() + s.selected.size());
        enables.reserve(enables.size() + s.selected.size());
        // Function-entry sites serving an entry and an exit probe:
        // gathered first, then planned once per site (entry_sites.h).
        std::map<std::uint32_t, std::pair<EntryVariant, std::size_t>> entry_sites;  // entry id -> wanted, text index
        const ValuesPlan* site_values = li < values.size() ? &values[li] : nullptr;
        auto changes_stub = [&](const probelist::Probe& p) {
            return site_values && (site_values->recipes.count(p.id) || site_values->silent_exits.count(p.id) ||
                                   site_values->deciding_exits.count(p.id));
        };
        // The stub a site's slot holds now, and where it goes (0: none of
        // ours); the module's slots read once, when first asked (10k sites
        // would be 10k reads in the stop).
        std::vector<std::uint8_t> held_area;
        std::uint64_t held_from = 0;  // where held_area was read (the area may be made meanwhile)
        auto held_stub = [&](std::uint64_t stub) {
            std::pair<std::array<std::uint8_t, kSiteStubSize>, std::uint64_t> held{};
            if (!module.site_stubs || stub < module.site_stubs) return held;
            const std::uint64_t index = (stub - module.site_stubs) / kSiteStubSize;
            if (index >= module.site_stub_slots) return held;
            if (held_from != module.site_stubs || held_area.size() != std::size_t{module.site_stub_slots} * kSiteStubSize) {
                held_area.resize(std::size_t{module.site_stub_slots} * kSiteStubSize);
                memory.read(module.site_stubs, held_area.data(), held_area.size());
                held_from = module.site_stubs;
            }
            std::memcpy(held.first.data(), held_area.data() + index * kSiteStubSize, kSiteStubSize);
            held.second = stub_target(held.first.data(), held.first.size());
            return held;
        };
        auto is_checked_exit = [&](std::uint64_t target) {
            return target && (target == checked_exits.first || target == checked_exits.second);
        };
        // A stub an earlier attach with values wrote (its entry point, or a
        // checked exit), which this attach without them must rewrite.
        auto goes_to_site_values = [&](std::uint64_t stub) {
            const std::uint64_t target = held_stub(stub).second;
            return target && (target == site_values_entry || target == deciding_exit || is_checked_exit(target));
        };
        // A call-form site's own stub, handing the handler `id` (or, with
        // values at the site, going where values_plan.h says).
        auto id_stub = [&](const probelist::Probe& p, std::uint32_t id, const std::string& by_id) -> SiteStub {
            const std::uint64_t at = module.site_stubs + kSiteStubSize * p.id;
            const std::uint32_t global = module.first_probe + p.id;
            const std::string& checked = handlers.site_id == HandlerSymbols::SiteId::counter ? kSilentExitCount : kSilentExit;
            static_assert(IPROBE_RT_SITE_RECIPE_OFFSET + sizeof(iprobe_rt_site_recipe) <= kSiteStubSize);
            static_assert(IPROBE_RT_SITE_RECIPE_OFFSET + sizeof(iprobe_rt_exit_recipe) <= kSiteStubSize);
            if (site_values) {
                if (auto r = site_values->recipes.find(p.id); r != site_values->recipes.end()) {
                    auto bytes = site_stub_bytes(id, handler_address(kSiteValuesEntry));
                    std::memcpy(bytes.data() + IPROBE_RT_SITE_RECIPE_OFFSET, &r->second, sizeof r->second);
                    return {module.site_stubs, at, bytes};
                }
                if (site_values->deciding_exits.count(p.id))
                    return {module.site_stubs, at, site_stub_bytes(id, handler_address(kDecidingExit))};
                if (auto r = site_values->exit_recipes.find(p.id); r != site_values->exit_recipes.end()) {
                    auto bytes = site_stub_bytes(global, handler_address(checked));
                    std::memcpy(bytes.data() + IPROBE_RT_SITE_RECIPE_OFFSET, &r->second, sizeof r->second);
                    return {module.site_stubs, at, bytes};
                }
            }
            // A checked exit stays one, with the recipe its slot holds,
            // while a call whose return was hooked is still in flight.
            auto [held, target] = held_stub(at);
            iprobe_rt_exit_recipe was{};
            std::memcpy(&was, held.data() + IPROBE_RT_SITE_RECIPE_OFFSET, sizeof was);
            if (p.kind == probelist::ProbeKind::exit && is_checked_exit(target) &&
                areas.hooked_in_flight(global + static_cast<std::uint32_t>(was.hooked_exit))) {
                const auto code = site_stub_bytes(global, handler_address(checked));
                std::memcpy(held.data(), code.data(), IPROBE_RT_SITE_RECIPE_OFFSET);
                return {module.site_stubs, at, held};
            }
            // A slot holding an entry's recipe keeps it under a plain stub
            // (an id stub, not the inline count one, whose code would lie
            // there): a thread may still be following it in the values entry
            // point, and it is this site's whatever attach comes.
            if (held[0] == kMovEdi && target &&
                std::any_of(held.begin() + IPROBE_RT_SITE_RECIPE_OFFSET, held.end(), [](std::uint8_t b) { return b != 0xcc; })) {
                const auto code = site_stub_bytes(id, handler_address(by_id));
                std::memcpy(held.data(), code.data(), IPROBE_RT_SITE_RECIPE_OFFSET);
                return {module.site_stubs, at, held};
            }
            const bool inline_count = handlers.site_id == HandlerSymbols::SiteId::counter && stats_tpoff != 0 &&
                                      stats_tpoff >= INT32_MIN && stats_tpoff < 0 && id <= INT32_MAX;
            return {module.site_stubs, at,
                    inline_count ? count_stub_bytes(static_cast<std::int32_t>(stats_tpoff), id, handler_address(by_id))
                                 : site_stub_bytes(id, handler_address(by_id))};
        };
        for (std::size_t k = 0; k < s.selected.size(); k++) {
            const probelist::Probe* p = s.selected[k];
            selected++;
            const bool is_exit = p->form == probelist::SiteForm::ret;
            if (is_exit || (!handlers.entry_enter.empty() && probelist::serves_returns(s.list.probes, p->id))) {
                auto& [wanted, at] = entry_sites[is_exit ? p->id - 1 : p->id];
                (is_exit ? wanted.exit : wanted.enter) = true;
                at = k;
                continue;
            }
            if (p->relocated)  // a relocated entry: never a call written over a function's code
                throw Error("the handler library has no entry point for function-entry sites, which " +
                                p->demangled + " (an entry without a pad) needs",
                            ExitCode::unavailable);
            const std::uint64_t site = addresses[k];
            const std::uint8_t* now = text[k].data();
            const std::uint32_t global = module.first_probe + p->id;
            const std::uint64_t ret = site + p->size;
            if (std::memcmp(now, p->placeholder.data(), p->size) == 0) {
                const std::string& symbol = handler_symbol(handlers, *p);
                if (symbol.empty())
                    throw Error("the handler library has no entry point for " + std::string(to_string(p->kind)) +
                                    (p->form == probelist::SiteForm::nop ? " NOP-form" : "") + " sites (" + p->demangled + ")",
                                ExitCode::unavailable);
                std::uint64_t callee = 0;
                if (const std::string& by_id = id_symbol(handlers, *p); !by_id.empty()) {
                    areas.site_stubs(running, module, stub_slots);
                    const std::uint32_t id = handlers.site_id == HandlerSymbols::SiteId::counter
                                                 ? counter_offset(region.probes()[global].stat, p->kind)
                                                 : global;
                    callee = module.site_stubs + kSiteStubSize * p->id;
                    site_stubs.push_back(id_stub(*p, id, by_id));
                } else {
                    auto& stub = stubs[&symbol];
                    if (!stub) stub = areas.shared_stub(module, handler_address(symbol));
                    callee = stub;
                }
                patches.push_back({site, SiteBytes(now, p->size), call_bytes(site, p->size, callee)});
                enables.push_back({global, ret, global});
                newly_enabled++;
            } else {
                // Enabled already, or a live compiler hook (binary not
                // coldpatched, hooks served by a linked runtime): register
                // the site, write nothing.
                check_site_bytes(s, running, *p, site, now, stubs_seen);
                already_enabled++;
                // Its stub still decides what it records: values at the site
                // come and go with the stub (a thread inside it: RetryLater).
                const std::string& by_id = id_symbol(handlers, *p);
                const std::uint64_t own = module.site_stubs + kSiteStubSize * p->id;
                if (!by_id.empty() && module.site_stubs && called_stub(site, now, p->size) == own &&
                    (changes_stub(*p) || goes_to_site_values(own))) {
                    const std::uint32_t id = handlers.site_id == HandlerSymbols::SiteId::counter
                                                 ? counter_offset(region.probes()[global].stat, p->kind)
                                                 : global;
                    site_stubs.push_back(id_stub(*p, id, by_id));
                }
                enables.push_back({global, ret, global});
            }
        }
        if (entry_sites.empty()) continue;
        areas.site_stubs(running, module, stub_slots);
        const bool counting = handlers.site_id == HandlerSymbols::SiteId::counter;
        EntrySiteHandlers entry_handlers{handlers, {}, 0};
        if (!handlers.entry_enter.empty()) entry_handlers.targets.enter = handler_address(handlers.entry_enter);
        if (!handlers.entry_return.empty()) entry_handlers.targets.exit = handler_address(handlers.entry_return);
        if (!handlers.entry_enter_return.empty())
            entry_handlers.targets.both = handler_address(handlers.entry_enter_return);
        for (const auto& [entry_id, wanted_at] : entry_sites) {
            const auto& [wanted, at] = wanted_at;
            const std::uint32_t global = module.first_probe + entry_id;
            const std::uint32_t id =
                counting ? counter_offset(region.probes()[global].stat, probelist::ProbeKind::entry) : global;
            entry_handlers.inline_count_tpoff = counting && stats_tpoff >= INT32_MIN && stats_tpoff < 0 &&
                                                        id <= INT32_MAX
                                                    ? static_cast<std::int32_t>(stats_tpoff)
                                                    : 0;
            const EntrySitePlan plan = plan_entry_site(s, running, module, entry_id, id, wanted, text[at].data(),
                                                       entry_handlers, memory, stubs_seen);
            site_stubs.push_back(plan.entry_slot);
            site_stubs.push_back(plan.exit_slot);
            if (plan.trampoline) site_stubs.push_back(*plan.trampoline);
            if (plan.patch) patches.push_back(*plan.patch);
            const std::uint64_t ret = running.load_bias + s.list.probes[entry_id].site + s.list.probes[entry_id].size;
            for (const bool exit : {false, true}) {
                if (!(exit ? plan.after.exit : plan.after.enter)) continue;
                enables.push_back({global + (exit ? 1u : 0u), ret, global});
                if (!(exit ? wanted.exit : wanted.enter)) continue;
                if (exit ? plan.before.exit : plan.before.enter) already_enabled++;
                else newly_enabled++;
            }
        }
    }
    sort_by_address(patches);
    return plan;
}

void insert_sites(Region& region, const SitesPlan& plan) {
    for (const auto& e : plan.enables) region.insert_site(e.return_address, e.keyed, region.probes()[e.keyed].stat);
}

// Conditions and values before code: a site going live finds them there.
// Written in the stop (they change what live probes record), one store per
// probe, so a running thread sees the old setting or the new; flattened
// into vectors before it (settings_of).
struct SettingStores {
    std::vector<ConditionStore> conditions;
    std::vector<std::pair<std::uint32_t, std::uint64_t>> values;  // global probe index, spec word
    // The return-value histogram is kept by the exit probe a hooked return
    // records, which at a -finstrument-functions entry need not be the next.
    std::vector<std::pair<std::uint32_t, std::uint32_t>> hist_moves;  // exit recorded, probe after the entry
    std::uint8_t exit_stamp = 0;  // ProbeSettings::exit_stamp
};

SettingStores settings_of(const SitesPlan& plan, const ProbeSettings& settings) {
    SettingStores stores{condition_stores(settings.conditions, plan.first_probes), {}, {}, settings.exit_stamp};
    for (std::size_t li = 0; li < settings.values.size() && li < plan.first_probes.size(); li++)
        for (const auto& [entry, exit] : settings.values[li].hooked_exit) {
            const std::uint32_t next = plan.first_probes[li] + entry + 1, at = plan.first_probes[li] + exit;
            if (at != next) stores.hist_moves.emplace_back(at, next);
        }
    std::map<std::uint32_t, std::uint64_t> value_specs;  // global probe index -> spec word
    for (std::size_t li = 0; li < settings.values.size() && li < plan.first_probes.size(); li++)
        for (const auto& [id, spec] : settings.values[li].specs) value_specs[plan.first_probes[li] + id] = spec_word(spec);
    // An attach without value options turns them off again.
    stores.values.reserve(plan.enables.size());
    for (const auto& e : plan.enables) {
        const auto spec = value_specs.find(e.global);
        stores.values.emplace_back(e.global, spec == value_specs.end() ? 0 : spec->second);
    }
    return stores;
}

void apply_settings(Region& region, const SettingStores& stores) {
    apply_conditions(region, stores.conditions);
    iprobe_rt_probe* probes = region.probes();
    for (const auto& [at, next] : stores.hist_moves) {
        if (at >= region.probe_count()) continue;
        __atomic_store_n(&probes[at].retval_hist, probes[next].retval_hist, __ATOMIC_RELEASE);
        if (probes[next].kind == static_cast<std::uint8_t>(probelist::ProbeKind::entry))  // not an exit's own
            __atomic_store_n(&probes[next].retval_hist, std::uint8_t{0}, __ATOMIC_RELEASE);
    }
    for (const auto& [global, word] : stores.values) {
        __atomic_store_n(reinterpret_cast<std::uint64_t*>(&probes[global].values), word, __ATOMIC_RELEASE);
        // before the code: an exit going live finds whether to read the clock
        if (probes[global].kind == static_cast<std::uint8_t>(probelist::ProbeKind::exit))
            __atomic_store_n(&probes[global].timed, stores.exit_stamp, __ATOMIC_RELEASE);
    }
}


// The stop's part of an attach, the sites inserted in the hash: stubs, the
// probes' settings, then the code (before_code runs in between), then the
// probes' flags.
AttachStats finish_attach(StoppedProcess& process, Region& region, const SitesPlan& plan, HandlerMode mode,
                          const SettingStores& settings, AttachStats stats, Clock::time_point started,
                          const std::function<void()>& before_code) {
    warm_probes(region);
    if (!unsafe_pcs(process, plan.patches).empty()) throw RetryLater{};
    throw_if_interrupted();
    std::vector<SiteStub> site_stubs = plan.site_stubs;
    write_site_stubs(process, site_stubs);
    apply_settings(region, settings);
    before_code();
    apply_patches(process, plan.patches);
    const std::uint64_t live_at = realtime_ns();
    for (const auto& e : plan.enables) {
        set_live(region.probes()[e.global], true, live_at);
        region.probes()[e.global].kept |= kept_by(mode, region.probes()[e.global].kind, settings.exit_stamp == 0);
    }
    update_timed(region);
    region.control()->generation++;
    stats.selected = plan.selected;
    stats.already_enabled = plan.already_enabled;
    stats.enabled = plan.newly_enabled;
    for (std::uint32_t i = 0; i < region.probe_count(); i++) stats.total_enabled += region.probes()[i].enabled;
    stats.modules.assign(plan.touched.begin(), plan.touched.end());
    stats.stop_us = process.stop_us;
    process.release();
    stats.pause_us = elapsed_us(started);
    return stats;
}

// What a plan made ahead depends on: the files mapped (the modules, the
// runtime, the region).  Its stub areas are there already (plan_ahead needs
// them) and only attach and detach map them, under the session lock.  A
// program maps and unmaps anonymous memory all the time (node's V8 its heap
// pages and JIT code, dozens of times a second): the plan stays good across
// that, and comparing it made every attach to node plan again in its stop.
bool plan_depends_on(const Mapping& m) { return !m.path.empty() && m.path[0] == '/'; }

bool same_maps(const std::vector<Mapping>& a, const std::vector<Mapping>& b) {
    auto x = a.begin(), y = b.begin();
    for (;; ++x, ++y) {
        x = std::find_if(x, a.end(), plan_depends_on);
        y = std::find_if(y, b.end(), plan_depends_on);
        if (x == a.end() || y == b.end()) return x == a.end() && y == b.end();
        if (x->start != y->start || x->end != y->end || x->offset != y->offset || x->perms != y->perms ||
            x->path != y->path)
            return false;
    }
}

struct PlannedAhead {
    std::vector<Mapping> maps;  // as planned: the stop checks they are unchanged
    Region region;
    SitesPlan plan;
};

// The plan of an attach that needs no remote call, made while the target
// runs, its sites already in the hash (insert-only: a key whose code is not
// live yet is never looked up); nullopt when the stop must do it all.
// `preparable`: nullopt only because what a stop makes is missing (the
// runtime, the handler library, the region, a module's entry or stub areas),
// which prepare_in_stop makes; false when the selection is refused (the
// stop says why) or something else keeps the plan in the stop.  Stubs in
// `unused_areas` (mapped by this attach's preparation stop) are written now.
std::optional<PlannedAhead> plan_ahead(const AttachOptions& options, std::vector<SelectedList>& lists,
                                       const HandlerSymbols& handlers, const std::string& handler_path,
                                       const std::optional<struct iprobe_rt_state>& state,
                                       std::vector<std::string>& redirected, const std::vector<ValuesPlan>& values,
                                       bool& preparable, const std::set<std::uint64_t>& unused_areas = {}) {
    preparable = false;
    try {
        std::vector<Mapping> maps = read_maps(options.pid);
        ProcessMemory memory(options.pid);
        const std::vector<RunningModule> modules = running_modules(memory, maps);
        std::vector<const RunningModule*> targets;
        for (auto& s : lists) targets.push_back(&match_module(s, modules, options.pid));
        for (std::size_t li = 0; li < lists.size(); li++)
            probelist::add_relocation_plans(lists[li].list, target_view(options.pid, targets[li]->path));
        for (std::size_t li = 0; li < lists.size(); li++)
            for (auto& f : drop_redirected(memory, lists[li].list, *targets[li], lists[li].selected)) redirected.push_back(f);
        // Nothing left to enable: the stop refuses it (and says why).
        if (std::all_of(lists.begin(), lists.end(), [](const SelectedList& s) { return s.selected.empty(); }))
            return std::nullopt;
        for (std::size_t li = 0; li < lists.size(); li++) check_selected_sites(memory, lists[li], *targets[li]);
        preparable = true;
        if (!state || !state->control ||
            state->mapped_pid != static_cast<std::uint32_t>(pid_in_own_namespace(options.pid)))
            return std::nullopt;
        std::optional<Region> region = Region::try_open(options.pid);
        if (!region) return std::nullopt;
        const std::optional<LoadedLibrary> handler_lib = find_loaded(options.pid, modules, handler_path);
        if (!handler_lib) return std::nullopt;
        PlannedAhead ahead{std::move(maps), std::move(*region), {}};
        const StubAreas found_only{
            [](Region& r, const RunningModule& running, const SelectedList& s) {
                const auto index = find_module(r, running, s);
                if (!index) throw NeedsStop{};
                return *index;
            },
            [](const RunningModule&, iprobe_rt_module& module) {
                if (!module.stub_page) throw NeedsStop{};
            },
            [](const RunningModule&, iprobe_rt_module& module, std::uint32_t slots) {
                if (!has_site_stubs(module, slots)) throw NeedsStop{};
            },
            [&memory](iprobe_rt_module& module, std::uint64_t target) -> std::uint64_t {
                if (const auto stub = find_stub(memory, module, target)) return *stub;
                throw NeedsStop{};
            },
            [&preparable](std::uint32_t) -> bool {
                preparable = false;  // read in the stop: the plan stays there
                throw NeedsStop{};
            }};
        ahead.plan = plan_sites(memory, ahead.region, lists, targets, handlers, *handler_lib, state->stats_tpoff, found_only,
                                values);
        drop_written_stubs(memory, ahead.plan.site_stubs);
        write_stubs_ahead(memory, ahead.plan.site_stubs, unused_areas);
        insert_sites(ahead.region, ahead.plan);
        return ahead;
    } catch (const NeedsStop&) {
        return std::nullopt;
    } catch (const Error&) {
        preparable = false;
        return std::nullopt;  // the stop plans again, and says what is wrong
    }
}

// The runtime and the handler library in the stopped target, injected
// when missing (`injected` set once this attach loaded one).
struct Libraries {
    LoadedLibrary libc;
    Injected runtime, handler;
};

Libraries load_libraries(StoppedProcess& process, std::vector<Mapping>& maps, std::vector<RunningModule>& modules,
                         const std::string& runtime_path, const std::string& handler_path, Clock::time_point deadline,
                         bool& injected) {
    refuse_if_seccomp_forbids(process);  // before the first call made in it
    Libraries libs{libc_of(process.pid(), modules), {}, {}};
    use_landings(process, libs.libc, find_loaded(process.pid(), modules, runtime_path));
    libs.runtime = ensure_library(process, maps, modules, libs.libc, runtime_path, deadline);
    use_landings(process, libs.libc, libs.runtime.library);
    injected = injected || libs.runtime.injected;
    libs.handler = handler_path == runtime_path
                       ? libs.runtime
                       : ensure_library(process, maps, modules, libs.libc, handler_path, deadline);
    return libs;
}

// The runtime's region: the one it has mapped, or one it creates now
// (`fresh_fd` its descriptor in the target, to map with map_fresh_region).
struct RuntimeRegion {
    struct iprobe_rt_state state {};
    std::uint64_t map_at = 0;  // iprobe_rt_map_region
    Region region;
    std::int64_t fresh_fd = -1;
};

// The geometry of the region an attach makes.
RegionGeometry region_geometry(const AttachOptions& options, std::uint32_t probe_capacity) {
    RegionGeometry g;
    g.probe_capacity = probe_capacity;
    g.ring_records = options.ring_records;
    g.thread_count = options.max_threads;
    return g;
}

RuntimeRegion open_or_create_region(StoppedProcess& process, const LoadedLibrary& runtime, const AttachOptions& options,
                                    std::uint32_t capacity, const TscCalibration& tsc) {
    RuntimeRegion out;
    const auto state_at = runtime.symbol("iprobe_rt_state");
    const auto map_at = runtime.symbol("iprobe_rt_map_region");
    if (!state_at || !map_at) throw Error(runtime.path + " is not the iprobe runtime", ExitCode::bad_input);
    out.map_at = *map_at;
    out.state = process.read_value<struct iprobe_rt_state>(*state_at);
    if (std::memcmp(out.state.magic, IPROBE_RT_STATE_MAGIC, 8) != 0)
        throw Error(runtime.path + " in process " + std::to_string(options.pid) + " has an unknown layout",
                    ExitCode::bad_input);
    const pid_t own_pid = pid_in_own_namespace(options.pid);
    std::optional<Region> existing;
    if (out.state.control != 0 && out.state.mapped_pid == static_cast<std::uint32_t>(own_pid))
        existing = Region::try_open(options.pid, out.state);
    if (existing) {
        out.region = std::move(*existing);
        return out;
    }
    iprobe_rt_control layout = region_layout(region_geometry(options, capacity), tsc.hz ? tsc : calibrate_tsc());
    layout.owner_pid = static_cast<std::uint32_t>(own_pid);
    const auto create_at = runtime.symbol("iprobe_rt_create_region");
    if (!create_at || !process.landing().with_result)
        throw Error(runtime.path + " is not the iprobe runtime of this version", ExitCode::bad_input);
    // Both runtime functions return an int (-errno on failure): rax's upper
    // half is not theirs, so the low 32 bits are the answer.
    out.fresh_fd = static_cast<std::int32_t>(process.call(*create_at, {layout.region_size}));
    if (out.fresh_fd < 0)
        throw Error("the runtime in process " + std::to_string(options.pid) + " could not create its region: " +
                    std::strerror(static_cast<int>(-out.fresh_fd)));
    UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, options.pid, 0)));
    UniqueFd fd(pidfd ? static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd.get(), static_cast<int>(out.fresh_fd), 0)) : -1);
    if (!fd) throw_errno("cannot take the new iprobe region of process " + std::to_string(options.pid));
    out.region = Region::create(std::move(fd), layout);
    return out;
}

// Has the runtime map the region it created (nothing when it had one).
void map_fresh_region(StoppedProcess& process, const RuntimeRegion& r) {
    if (r.fresh_fd < 0) return;
    const auto rc = static_cast<std::int32_t>(process.call(r.map_at, {static_cast<std::uint64_t>(r.fresh_fd)}));
    if (rc != 0)
        throw Error("the runtime in process " + std::to_string(process.pid()) + " could not map its region: " +
                    std::strerror(static_cast<int>(-rc)));
}

// What plan_sites asks of a module's stub areas (StubAreas), made ahead:
// the stub page; the site-stub area, sized as plan_sites sizes it, when a
// selected site takes a stub of its own or is a function-entry site; the
// shared stub of each handler the other sites call.  Made for sites already
// on too (a stub no site calls is never run; detach reads the code, not the
// areas, and a later attach finds and uses them).  A site-stub area mapped
// now goes into `unused_areas`.
void prepare_stub_areas(StoppedProcess& process, const LoadedLibrary& libc, const RunningModule& running,
                        iprobe_rt_module& module, const SelectedList& s, const HandlerSymbols& handlers,
                        const LoadedLibrary& handler_lib, std::set<std::uint64_t>& unused_areas) {
    if (s.selected.empty()) return;
    ensure_stub_page(process, libc, running, module);
    bool own_stubs = false;
    std::set<const std::string*> shared;  // handler symbols, one of `handlers`' strings each
    for (const probelist::Probe* p : s.selected) {
        const bool entry_site = p->form == probelist::SiteForm::ret ||
                                (!handlers.entry_enter.empty() && probelist::serves_returns(s.list.probes, p->id));
        if (entry_site || !id_symbol(handlers, *p).empty()) own_stubs = true;
        else if (!p->relocated) shared.insert(&handler_symbol(handlers, *p));
    }
    const std::uint64_t area_before = module.site_stubs;
    if (own_stubs) ensure_site_stubs(process, libc, running, module, site_stub_slots_for(s.list));
    if (module.site_stubs != area_before) unused_areas.insert(module.site_stubs);
    for (const std::string* symbol : shared)
        if (const auto target = handler_lib.symbol(*symbol)) stub_for(process, module, *target);
}

// What the preparation stop did.
struct Preparation {
    std::uint64_t pause_us = 0, stop_us = 0;
    bool runtime_injected = false, handler_injected = false;
    // Its site-stub areas: no site calls them yet, so their stubs are
    // written while the target runs (node's 71 005 entries: 60 ms less in
    // the stop that writes the sites).
    std::set<std::uint64_t> unused_areas;
};

// The preparation stop of a first attach: only what needs the target
// stopped and is cheap (remote calls: dlopen, memfd, mmap), so that the
// sites can be planned while it runs again (plan_ahead).  The region is
// mapped with no probe on, as after a detach: a later attach, or detach,
// takes it from there if this one goes no further.
Preparation prepare_in_stop(const AttachOptions& options, std::vector<SelectedList>& lists,
                            const HandlerSymbols& handlers, const std::string& runtime_path,
                            const std::string& handler_path, std::uint32_t capacity, const TscCalibration& tsc,
                            bool& injected) {
    return with_world_stopped(options.pid, options.safe_point_timeout, [&](StoppedProcess& process,
                                                                            Clock::time_point started,
                                                                            Clock::time_point deadline) {
        auto maps = read_maps(options.pid);
        auto modules = running_modules(process.memory(), maps);
        const Libraries libs = load_libraries(process, maps, modules, runtime_path, handler_path, deadline, injected);
        Preparation done;
        done.runtime_injected = libs.runtime.injected;
        done.handler_injected = libs.handler.injected && handler_path != runtime_path;
        // Mapped first: killed while the areas are made, this attach leaves
        // them recorded in the region the next one opens.
        RuntimeRegion r = open_or_create_region(process, libs.runtime.library, options, capacity, tsc);
        map_fresh_region(process, r);
        for (auto& s : lists) {
            const RunningModule& running = match_module(s, modules, options.pid);
            iprobe_rt_module& module = r.region.modules()[find_or_add_module(r.region, running, s)];
            prepare_stub_areas(process, libs.libc, running, module, s, handlers, libs.handler.library,
                               done.unused_areas);
        }
        done.stop_us = process.stop_us;
        process.release();
        done.pause_us = elapsed_us(started);
        return done;
    });
}

// The region's geometry, and whether it is not what the user asked for (a
// region made by an earlier attach keeps its own).
void note_geometry(AttachStats& stats, const Region& region, const AttachOptions& options) {
    stats.ring_records = region.ring_records();
    stats.thread_slots = region.thread_count();
    stats.geometry_kept = options.geometry_given &&
                          (stats.ring_records != options.ring_records || stats.thread_slots != options.max_threads);
}

// The write stop's stats with the preparation stop's pause (if there was one).
AttachStats with_preparation(AttachStats stats, const Preparation& prepared) {
    stats.write_pause_us = stats.pause_us;
    stats.prepare_pause_us = prepared.pause_us;
    stats.runtime_injected = stats.runtime_injected || prepared.runtime_injected;
    stats.handler_injected = stats.handler_injected || prepared.handler_injected;
    if (prepared.pause_us > stats.pause_us) {
        stats.pause_us = prepared.pause_us;
        stats.stop_us = prepared.stop_us;
    }
    return stats;
}

// --no-durations (AttachOptions::exit_times false) is the trace handler's
// plain record at the entry flow's hooked returns: refused, before the
// target stops, wherever an exit would need its time or a frame.
void check_exit_times(const AttachOptions& options, const Condition& condition, const std::vector<SelectedList>& lists) {
    if (options.exit_times) return;
    if (options.mode != HandlerMode::trace || !options.handlers.enter.empty())
        throw Error("--no-durations is the runtime's trace handler's (--handler trace): other handlers read no clock",
                    ExitCode::usage);
    if (!condition.empty() || options.retval_histogram || options.values.any())
        throw Error("--no-durations records exits without their time, and --when, --min-duration, --args, --retval "
                    "and --backtrace go through paths that time every call: drop one or the other",
                    ExitCode::usage);
    for (const auto& s : lists)
        for (const probelist::Probe* p : s.selected)
            if (p->kind == probelist::ProbeKind::exit && p->form != probelist::SiteForm::ret)
                throw Error("--no-durations: " + p->demangled + "'s exit is a call site of its own (" + s.source +
                                ": the -finstrument-functions flow), and a detach finds such calls in flight "
                                "by the timed frames --no-durations does without; attach it without --no-durations, "
                                "or select its entries only (--entry-only)",
                            ExitCode::usage);
}

}  // namespace

AttachStats attach(const AttachOptions& options) {
    check_target(options.pid);
    target_owner(options.pid);  // not_found when it is gone
    std::vector<SelectedList> lists = load_lists(options);
    const HandlerSymbols handlers = resolve_handlers(options);
    const Condition condition = attach_condition(options);
    if ((!condition.empty() || options.retval_histogram) &&
        (options.mode != HandlerMode::trace || !options.handlers.enter.empty()))
        throw Error("--when, --min-duration and --retval need the runtime's trace handler (--handler trace)",
                    ExitCode::usage);
    // Planned (and refused) before the target stops.
    const ConditionPlan conditions = plan_conditions(condition, options, lists);
    check_exit_times(options, condition, lists);
    const std::string runtime_path = runtime_path_of(options);
    const std::string handler_path = handlers.library.empty() ? runtime_path : canonical_or_same(handlers.library);
    SessionLock lock(options.pid);
    // A child forked from a probed process still runs its parent's sites,
    // whose stubs carry the parent's probe ids: they go back to their
    // bytes (a stop of their own) before the child is probed as itself.
    std::size_t inherited_restored = 0;
    auto before = runtime_state(options.pid);
    if (before && !inherited_modules(options.pid, *before).empty()) {
        DetachOptions inherited;
        inherited.pid = options.pid;
        inherited.safe_point_timeout = options.safe_point_timeout;
        inherited_restored = detach_locked(inherited).sites_restored;
        before = runtime_state(options.pid);
    }
    for (const auto& m : read_maps(options.pid))
        if (basename_of(m.path).rfind("libc.so", 0) == 0 || runtime_file_name(basename_of(m.path)))
            elf_cache().preload(options.pid, m.path);
    elf_cache().preload(options.pid, runtime_path);
    elf_cache().preload(options.pid, handler_path);
    const TscCalibration tsc = before && before->control ? TscCalibration{} : calibrate_tsc();

    if (options.values.any() && options.mode != HandlerMode::trace)
        throw Error("--args, --retval and --backtrace record into the trace stream: use them with --handler trace",
                    ExitCode::usage);
    std::vector<ValuesPlan> values_plans;
    for (const auto& s : lists) values_plans.push_back(plan_values(options.pid, s, options.values, !condition.empty()));
    const ProbeSettings settings{conditions, values_plans,
                                 options.exit_times ? std::uint8_t{0} : std::uint8_t{IPROBE_RT_EXIT_UNSTAMPED}};

    std::uint32_t capacity = 4096;
    for (auto& s : lists) capacity += static_cast<std::uint32_t>(s.list.probes.size()) * 2;
    // The region this attach would make, checked before anything changes.
    if (!(before && before->control)) (void)region_layout(region_geometry(options, capacity), tsc);

    // Planned while the target runs when nothing needs it stopped (the
    // runtime, its region and the modules' stub areas are there already):
    // the stop then only checks and writes.  A first attach makes what needs
    // a stop in a short one first (prepare_in_stop), then plans while the
    // target runs again.  Always, however few the sites: one stop also reads
    // the maps and modules and checks every site inside it, so two stops
    // paused less even for 10 probes (many_5000: 5.3 ms + 0.4 ms against
    // 7.4 ms; node: 25 ms + 3.4 ms against 45 ms), at the same wall time
    // (bench/RESULTS.md, "A first attach in two stops").
    std::vector<std::string> redirected;  // functions `iprobe patch` replaced, found while planning
    bool preparable = false;
    std::optional<PlannedAhead> ahead =
        plan_ahead(options, lists, handlers, handler_path, before, redirected, values_plans, preparable);
    bool injected = false;  // by this attach: said when it fails after that
    try {
    Preparation prepared;
    if (!ahead && preparable) {
        prepared = prepare_in_stop(options, lists, handlers, runtime_path, handler_path, capacity, tsc, injected);
        ahead = plan_ahead(options, lists, handlers, handler_path, runtime_state(options.pid), redirected, values_plans,
                           preparable, prepared.unused_areas);
        if (options.between_stops) options.between_stops();
    }
    SettingStores settings_ahead;
    if (ahead) {
        settings_ahead = settings_of(ahead->plan, settings);
        warm_probes(ahead->region);
    }
    AttachStats written = with_world_stopped(options.pid, options.safe_point_timeout, [&](StoppedProcess& process,
                                                                            Clock::time_point started,
                                                                            Clock::time_point deadline) {
        AttachStats stats;
        stats.threads = process.threads().size();
        stats.inherited_sites_restored = inherited_restored;
        for (const auto& s : lists) {
            stats.exits_left_off += s.exits_left_off;
            stats.exits_runtime_reads += s.exits_runtime_reads;
            stats.exits_return_twice += s.exits_return_twice;
            stats.refused += s.refused.size();
            if (stats.refused_example.empty() && !s.refused.empty())
                stats.refused_example = s.refused.front()->demangled + ": " + s.refused.front()->reason;
        }
        stats.patched_skipped = redirected;
        for (const auto& v : values_plans) {
            stats.values_unavailable += v.unavailable;
            stats.values_untyped += v.untyped;
            stats.values_optimized_out += v.optimized_out;
            stats.values_no_return += v.no_return;
        }
        for (const auto& list : conditions)
            for (const auto& [id, fc] : list) stats.when_undecidable += fc.undecidable;
        if (ahead && same_maps(read_maps(options.pid), ahead->maps)) {
            // Planned while the target ran; only the writes are left.
            stats.planned_while_running = true;
            note_geometry(stats, ahead->region, options);
            return finish_attach(process, ahead->region, ahead->plan, options.mode, settings_ahead, std::move(stats), started,
                                 [] {});
        }
        auto maps = read_maps(options.pid);
        auto modules = running_modules(process.memory(), maps);
        std::vector<const RunningModule*> targets;
        for (auto& s : lists) targets.push_back(&match_module(s, modules, options.pid));
        // A list given as FILE.probes has no moved bytes for its relocated
        // entries (small functions without a pad): the module's file has them.
        for (std::size_t li = 0; li < lists.size(); li++)
            probelist::add_relocation_plans(lists[li].list, target_view(options.pid, targets[li]->path));
        // A function replaced by `iprobe patch` keeps its patch: its probes
        // are skipped (the replacement has probes of its own).
        for (std::size_t li = 0; li < lists.size(); li++)
            for (auto& f : drop_redirected(process.memory(), lists[li].list, *targets[li], lists[li].selected))
                stats.patched_skipped.push_back(f);
        if (!stats.patched_skipped.empty() &&
            std::all_of(lists.begin(), lists.end(), [](const SelectedList& s) { return s.selected.empty(); }))
            throw Error(stats.patched_skipped.front() + (stats.patched_skipped.size() > 1 ? " and the others selected are" : " is") +
                            " replaced by 'iprobe patch' (its entry jumps to the replacement): probe the replacement "
                            "(iprobe attach PID --probes LIB.so --functions SYMBOL), or revert it first",
                        ExitCode::busy);
        for (std::size_t li = 0; li < lists.size(); li++) check_selected_sites(process.memory(), lists[li], *targets[li]);
        const Libraries libs = load_libraries(process, maps, modules, runtime_path, handler_path, deadline, injected);
        const LoadedLibrary& libc = libs.libc;
        const Injected& runtime = libs.runtime;
        const Injected& handler_lib = libs.handler;
        stats.runtime_injected = runtime.injected;
        stats.handler_injected = handler_lib.injected && handler_path != runtime_path;
        // Modules may have moved in `modules` after an injection: re-match.
        targets.clear();
        for (auto& s : lists) targets.push_back(&match_module(s, modules, options.pid));

        RuntimeRegion fresh = open_or_create_region(process, runtime.library, options, capacity, tsc);
        Region& region = fresh.region;
        const struct iprobe_rt_state& state = fresh.state;
        StubAreas areas{
            [](Region& r, const RunningModule& running, const SelectedList& s) { return find_or_add_module(r, running, s); },
            [&](const RunningModule& running, iprobe_rt_module& module) { ensure_stub_page(process, libc, running, module); },
            [&](const RunningModule& running, iprobe_rt_module& module, std::uint32_t slots) {
                ensure_site_stubs(process, libc, running, module, slots);
            },
            [&](iprobe_rt_module& module, std::uint64_t target) { return stub_for(process, module, target); },
            [&, hooked = std::optional<std::optional<std::map<std::uint32_t, std::uint64_t>>>{}](std::uint32_t exit) mutable {
                if (!hooked) hooked = hooked_exits_in_flight(process.memory(), runtime.library);
                return !*hooked || (*hooked)->count(exit) != 0;  // unknown: as if in flight
            }};
        const SitesPlan plan = plan_sites(process.memory(), region, lists, targets, handlers, handler_lib.library,
                                          state.stats_tpoff, areas, values_plans);
        // Table first, code second: a site only becomes live once its
        // return address resolves.
        insert_sites(region, plan);
        note_geometry(stats, region, options);
        return finish_attach(process, region, plan, options.mode, settings_of(plan, settings), std::move(stats), started,
                             [&] { map_fresh_region(process, fresh); });
    });
    return with_preparation(std::move(written), prepared);
    } catch (const Error& e) {
        // The runtime cannot be unloaded (linked -z nodelete: its fork and
        // thread-exit handlers are registered in libc), so say where it is.
        if (!injected || !process_alive(options.pid)) throw;
        throw Error(std::string(e.what()) + "; the runtime it loaded stays in the process, inert (no probe on, " +
                        "nothing running; a later attach uses it): 'iprobe status " + std::to_string(options.pid) +
                        "' shows it",
                    e.code());
    }
}

DetachStats detach(const DetachOptions& options) {
    check_target(options.pid);
    SessionLock lock(options.pid);
    return detach_locked(options);
}

namespace {

DetachStats detach_locked(const DetachOptions& options) {
    // Sites, lists and stubs come from the process's maps and code, never
    // from its region (see live_sites.h): a region the target rewrote, or
    // none, only means no flags to clear.  Planned while the target runs:
    // only we rewrite its sites, under the session lock, and apply_patches()
    // checks every site again once it is stopped.
    std::optional<Region> region;
    std::string region_problem;
    try {
        region = Region::try_open(options.pid);
    } catch (const Error& e) {
        if (e.code() != ExitCode::bad_input) throw;
        region_problem = e.what();
    }
    ProcessMemory memory(options.pid);
    // A child forked from a probed process runs its parent's sites with no
    // region of its own: the runtime kept the parent's module table.
    std::vector<iprobe_rt_module> inherited;
    if (!region)
        if (const auto state = runtime_state(options.pid)) inherited = inherited_modules(options.pid, *state);
    const std::vector<AttachedModule> modules =
        probed_modules(options.pid, region ? &*region : nullptr, memory, inherited);
    if (!region && region_problem.empty() && modules.empty())
        throw Error("process " + std::to_string(options.pid) + " has no iprobe region and no probed module: nothing to detach",
                    ExitCode::not_found);
    StubChecker stubs(memory);
    std::vector<Patch> patches;
    std::size_t probes_off = 0;            // probes the patches turn off (an entry site serves two)
    std::vector<std::uint32_t> flags_off;  // region probe flags to clear
    std::vector<std::uint32_t> exit_hooks_off;  // exit probes whose own sites go back to their NOP
    std::vector<std::pair<const AttachedModule*, std::size_t>> selected;
    const probelist::ProbeMatcher matcher(options.selector);
    // Given selections: the chosen ids of the module whose list is the
    // selection's (same build-id, same probes).
    auto chosen_of = [&](const AttachedModule& m) -> std::optional<std::vector<bool>> {
        if (options.selections.empty()) return std::nullopt;
        std::vector<bool> chosen(m.list.probes.size(), false);
        for (const ProbeSelection& sel : options.selections)
            if (sel.list && sel.list->build_id == m.list.build_id && sel.list->probes.size() == m.list.probes.size())
                for (std::uint32_t id : sel.probes)
                    if (id < chosen.size()) chosen[id] = true;
        return chosen;
    };
    for (const AttachedModule& m : modules) {
        const std::optional<std::vector<bool>> chosen = chosen_of(m);
        const iprobe_rt_module rm = region && m.region_index != kNotInRegion ? region->modules()[m.region_index]
                                                                             : iprobe_rt_module{};
        const bool ids_match = region && m.region_index != kNotInRegion && m.list.probes.size() == rm.probe_count &&
                               rm.first_probe <= region->probe_capacity() &&
                               rm.probe_count <= region->probe_capacity() - rm.first_probe;
        std::vector<std::uint64_t> addresses;
        std::vector<std::size_t> which;
        for (std::size_t k = 0; k < m.list.probes.size(); k++)
            if (m.sites[k] && (chosen ? (*chosen)[k] : matcher.matches(m.list.probes[k]))) {
                addresses.push_back(m.sites[k]);
                which.push_back(k);
            }
        const std::vector<SiteText> text = read_sites(memory, addresses);
        // Function-entry sites: what stays on after the selected probes go.
        std::map<std::uint32_t, std::pair<EntryVariant, std::size_t>> entry_sites;  // entry id -> off, text index
        for (std::size_t j = 0; j < which.size(); j++) {
            const probelist::Probe& p = m.list.probes[which[j]];
            selected.emplace_back(&m, which[j]);
            if (ids_match && p.id < rm.probe_count) flags_off.push_back(rm.first_probe + p.id);
            const bool is_exit = p.form == probelist::SiteForm::ret;
            if (is_exit || probelist::serves_returns(m.list.probes, p.id)) {
                auto& [off, at] = entry_sites[is_exit ? p.id - 1 : p.id];
                (is_exit ? off.exit : off.enter) = true;
                at = j;
                continue;
            }
            if (site_state(p, addresses[j], text[j], stubs) != SiteState::live) continue;
            patches.push_back({addresses[j], SiteBytes(text[j].data(), p.size), SiteBytes(p.placeholder.data(), p.size)});
            probes_off++;
            if (ids_match && p.kind == probelist::ProbeKind::exit && p.id < rm.probe_count)
                exit_hooks_off.push_back(rm.first_probe + p.id);
        }
        for (const auto& [entry_id, off_at] : entry_sites) {
            const auto& [off, at] = off_at;
            const probelist::Probe& entry = m.list.probes[entry_id];
            const std::uint64_t site = addresses[at];
            if (site_state(entry, site, text[at], stubs) != SiteState::live) continue;
            const std::uint64_t target = called_stub(site, text[at].data(), entry.size);
            const EntryVariant on = variant_at(target, entry_id).value_or(EntryVariant{true, false});
            EntryVariant stays{on.enter && !off.enter, on.exit && !off.exit};
            if (stays == on) continue;
            SiteBytes after(entry.placeholder.data(), entry.size);
            if (stays.any()) {
                // Its stub was written with the others when the site was
                // enabled; a handler without it loses both probes.
                const std::uint64_t area = target - variant_stub(0, entry_id, on);
                const std::uint64_t stub = variant_stub(area, entry_id, stays);
                std::uint8_t bytes[kSiteStubSize];
                memory.read(stub, bytes, sizeof bytes);
                if (stub_target(bytes, sizeof bytes)) {
                    after = jump_bytes(site, entry.size, stub);
                } else {
                    if (ids_match && entry_id + 1 < rm.probe_count)
                        flags_off.push_back(rm.first_probe + entry_id + (stays.enter ? 0 : 1));
                    stays = {};
                }
            }
            probes_off += (on.enter && !stays.enter) + (on.exit && !stays.exit);
            patches.push_back({site, SiteBytes(text[at].data(), entry.size), after});
        }
    }
    sort_by_address(patches);

    if (region) warm_probes(*region);
    // The runtime, whose return pool says which calls' returns are hooked:
    // read before the stop, and only when exit hooks of their own go off.
    std::optional<LoadedLibrary> runtime_library;
    if (region && !exit_hooks_off.empty())
        if (const auto mapped = mapped_runtime(options.pid))
            runtime_library = find_loaded(options.pid, running_modules(memory, read_maps(options.pid)), mapped->path);
    DetachStats stats = with_world_stopped(options.pid, options.safe_point_timeout, [&](StoppedProcess& process,
                                                                                       Clock::time_point started,
                                                                                       Clock::time_point) {
        DetachStats st;
        st.threads = process.threads().size();
        if (region) warm_probes(*region);
        if (!unsafe_pcs(process, patches).empty()) throw RetryLater{};
        throw_if_interrupted();
        apply_patches(process, patches);
        if (region) {
            const std::uint64_t stopped_at = region_clock_now(*region);
            std::vector<std::pair<std::uint32_t, std::uint32_t>> marked;
            st.exits_lost = abandon_exits_in_flight(*region, exit_hooks_off, [&] {
                return runtime_library ? hooked_exits_in_flight(memory, *runtime_library) : std::nullopt;
            }, marked);
            mark_exits_lost(*region, exit_hooks_off, marked, stopped_at);
            __atomic_fetch_add(&region->control()->exits_lost_at_detach, st.exits_lost, __ATOMIC_RELAXED);
            iprobe_rt_probe* probes = region->probes();
            const std::uint64_t off_at = realtime_ns();
            for (auto g : flags_off) set_live(probes[g], false, off_at);
            update_timed(*region);
            keep_timed_while_racing(*region, exit_hooks_off, flags_off);
            region->control()->generation++;
        }
        st.stop_us = process.stop_us;
        process.release();
        st.pause_us = elapsed_us(started);
        st.disabled = probes_off;
        st.sites_restored = patches.size();
        return st;
    });
    stats.region_problem = region_problem;
    // What detach reports is what the code now holds, read back site by site.
    StubChecker stubs_after(memory);
    std::vector<std::vector<SiteState>> states;
    for (const AttachedModule& m : modules) {
        states.push_back(site_states(m, memory, stubs_after));
        for (SiteState state : states.back()) stats.still_enabled += state == SiteState::live;
    }
    for (const auto& [m, k] : selected)
        stats.not_restored += states[static_cast<std::size_t>(m - modules.data())][k] == SiteState::live;
    if (!inherited.empty() && stats.still_enabled == 0) forget_inherited_modules(options.pid);
    return stats;
}

}  // namespace

namespace {

// What the region says (its own bookkeeping; the code is read apart): every
// count clamped by Region, every size of a string or id by its field.
void add_region_status(const Region& region, Status& st) {
    st.region = true;
    const auto* cb = region.control();
    st.ring_records = region.ring_records();
    st.ring_count = region.ring_count();
    st.no_ring_events = cb->no_ring_events;
    st.no_slot_events = cb->no_slot_events;
    st.unknown_site_events = cb->unknown_site_events;
    st.unhooked_returns = cb->unhooked_returns;
    st.unhooked_pool_empty = cb->unhooked_pool_empty;
    st.region_bytes = region.size();
    for (std::uint32_t i = 0; i < region.module_count(); i++) {
        const auto& m = region.modules()[i];
        ModuleStatus ms;
        ms.path.assign(m.path, ::strnlen(m.path, sizeof m.path));
        ms.probes_path.assign(m.probes_path, ::strnlen(m.probes_path, sizeof m.probes_path));
        ms.build_id = probelist::hex(
            std::span<const std::uint8_t>(m.build_id, std::min<std::size_t>(m.build_id_size, sizeof m.build_id)));
        ms.load_bias = m.load_bias;
        ms.stub_page = m.stub_page;
        ms.probes = m.probe_count;
        if (m.first_probe <= region.probe_capacity() && m.probe_count <= region.probe_capacity() - m.first_probe)
            for (std::uint32_t p = 0; p < m.probe_count; p++) ms.enabled += region.probes()[m.first_probe + p].enabled;
        st.modules.push_back(ms);
    }
    for (std::uint32_t i = 0; i < region.thread_count(); i++)
        if (__atomic_load_n(&region.thread(i)->state, __ATOMIC_ACQUIRE) != IPROBE_RT_RING_FREE) st.threads++;
    for (std::uint32_t i = 0; i < region.ring_count(); i++) {
        const auto* r = region.ring(i);
        const std::uint32_t state = __atomic_load_n(&r->state, __ATOMIC_ACQUIRE);
        st.dropped += r->dropped;
        if (state == IPROBE_RT_RING_FREE) continue;
        RingStatus rs;
        rs.index = i;
        rs.tid = r->tid;
        rs.state = state == IPROBE_RT_RING_OWNED ? "owned" : "retired";
        const std::uint64_t head = __atomic_load_n(&r->head, __ATOMIC_ACQUIRE);
        rs.pending = head > r->tail ? head - r->tail : 0;
        rs.dropped = r->dropped;
        st.rings.push_back(rs);
    }
}

// What a module's code holds at its sites: ours (live), or someone else's.
void count_site_states(const AttachedModule& m, const ProcessMemory& memory, StubChecker& stubs, ModuleStatus& ms) {
    ms.live = 0;
    for (SiteState state : site_states(m, memory, stubs)) {
        ms.live += state == SiteState::live;
        ms.foreign += state == SiteState::other;
    }
}

// A child forked from a probed process: the modules whose sites it still
// runs from its parent, and how many of those sites are live.
void add_inherited_status(pid_t pid, Status& st) {
    const auto state = runtime_state(pid);
    if (!state || state->control != 0 || state->forked_from == 0) return;
    st.forked_from = static_cast<pid_t>(state->forked_from);
    st.fork_child_events = state->fork_child_events;
    const std::vector<iprobe_rt_module> inherited = inherited_modules(pid, *state);
    if (inherited.empty()) return;
    try {
        const ProcessMemory memory(pid);
        StubChecker stubs(memory);
        for (const AttachedModule& m : probed_modules(pid, nullptr, memory, inherited)) {
            ModuleStatus ms;
            ms.path = m.running.path;
            ms.probes = static_cast<std::uint32_t>(m.list.probes.size());
            count_site_states(m, memory, stubs, ms);
            st.inherited_live += static_cast<std::uint64_t>(ms.live);
            st.modules.push_back(ms);
        }
    } catch (const Error& e) {
        st.sites_unread = e.what();
    }
}

}  // namespace

Status region_status(UniqueFd region_fd) {
    Status st;
    const Region region = Region::adopt(std::move(region_fd), "the region");
    add_region_status(region, st);
    return st;
}

Status status(pid_t pid) {
    check_target(pid);
    Status st;
    st.pid = pid;
    const auto runtime = mapped_runtime(pid);
    if (runtime) {
        st.runtime_loaded = true;
        st.runtime_path = runtime->path;
    }
    auto opened = runtime ? Region::try_open(pid, runtime->state) : std::nullopt;
    if (!opened) {
        add_inherited_status(pid, st);
        return st;
    }
    Region& region = *opened;
    add_region_status(region, st);
    try {
        const ProcessMemory memory(pid);
        StubChecker stubs(memory);
        for (const AttachedModule& m : attached_modules(pid, region, memory)) {
            ModuleStatus& ms = st.modules[m.region_index];
            ms.sites = m.list.flow == IPROBE_FLOW_UNPREPARED ? "relocated" : m.list.has_relocated() ? "pad+relocated" : "pad";
            ms.flow = probelist::flow_name(m.list.flow);
            count_site_states(m, memory, stubs, ms);
        }
        // Entries replaced by `iprobe patch` are ours, not foreign code: one
        // site serving two probes (the function's entry and its exit).
        for (const PatchedFunction& f : patched_functions(pid))
            for (ModuleStatus& ms : st.modules)
                if (ms.path == f.module) ms.foreign -= std::min<std::uint32_t>(ms.foreign, 2);
    } catch (const Error& e) {
        st.sites_unread = e.what();
    }
    return st;
}

}  // namespace iprobe::hotpatch
