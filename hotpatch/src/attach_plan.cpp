#include "attach_plan.h"

#include <signal.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <map>

#include "iprobe/probelist/probe_source.h"
#include "iprobe/probelist/symbol_probes.h"
#include "iprobe/support/error.h"
#include "relocated_entries.h"
#include "session.h"
#include "stubs.h"

namespace iprobe::hotpatch {

std::string describe_selector(const probelist::ProbeSelector& s) {
    std::string out;
    for (auto& g : s.function_globs) out += (out.empty() ? "" : ",") + g;
    if (!s.file_globs.empty()) {
        out += " files ";
        for (auto& g : s.file_globs) out += g + " ";
    }
    return out.empty() ? "(all)" : out;
}

bool module_named(const std::string& base, const std::string& name) {
    return base == name || (base.starts_with(name) && (base[name.size()] == '.' || base[name.size()] == '-'));
}

std::string module_source(pid_t pid, const std::string& name) {
    std::vector<std::string> found;
    for (const Mapping& m : read_maps(pid)) {
        if (m.path.empty() || m.path[0] != '/') continue;
        const bool named = module_named(basename_of(m.path), name);
        if (named && std::find(found.begin(), found.end(), m.path) == found.end()) found.push_back(m.path);
    }
    if (found.empty())
        throw Error("process " + std::to_string(pid) + " has no module named " + name + " loaded (see /proc/" +
                        std::to_string(pid) + "/maps); a library it loads later (dlopen, as java loads libjvm) is "
                        "probed by attaching once it is loaded, or from its first call on by starting the program "
                        "with 'iprobe run --module " + name + " -- PROGRAM'",
                    ExitCode::not_found);
    if (found.size() > 1)
        throw Error("--module " + name + " names " + std::to_string(found.size()) + " modules of process " +
                        std::to_string(pid) + " (" + found[0] + ", " + found[1] + "); give its full file name",
                    ExitCode::usage);
    return target_view(pid, found.front());
}

std::vector<ProbeSelection> select_probes(const std::vector<std::string>& sources,
                                          const probelist::ProbeSelector& selector) {
    std::vector<ProbeSelection> out;
    for (const auto& source : sources) {
        auto list = std::make_shared<const probelist::ProbeList>(probelist::load_probes_or_symbols(source));
        ProbeSelection s{source, list, {}};
        for (const probelist::Probe* p : selector.select(*list)) s.probes.push_back(p->id);
        out.push_back(std::move(s));
    }
    return out;
}

namespace {

// Runtimes that walk their own stack through the return addresses of the
// C++ functions their generated code called: a return hooked there is an
// address in none of their code, and they die at their next garbage
// collection or stack trace.
//  - V8 (node, and every program that embeds it) finds the code of each
//    exit frame from the return address of the function its builtins
//    called (a runtime function, a C++ builtin, an API callback), and its
//    builtins' frames from theirs ("Check failed: maybe_code.has_value()").
//  - HotSpot (libjvm) takes a thread's last Java frame from the return
//    address of the VM function its interpreter or compiled code called
//    (SIGSEGV in frame::sender).
struct FrameWalkingRuntime {
    std::string_view marker;  // a function of this prefix says the list holds the runtime
    std::vector<std::string_view> prefixes, parts;  // the functions its code calls
};
const FrameWalkingRuntime kFrameWalkingRuntimes[] = {
    {"v8::internal::",
     {"Builtins_", "v8::internal::Runtime_", "v8::internal::Builtin_"},
     {"::Builtin_Impl_", "FunctionCallbackInfo<", "PropertyCallbackInfo<"}},
    {"InterpreterRuntime::",
     {"InterpreterRuntime::", "SharedRuntime::", "OptoRuntime::", "Runtime1::", "Deoptimization::",
      "JVMCIRuntime::", "SafepointSynchronize::", "StubRoutines::", "ZBarrierSetRuntime::", "ShenandoahRuntime::",
      "G1BarrierSetRuntime::", "BarrierSetNMethod::", "JavaThread::check_special_condition_for_native_trans",
      "Continuation"},
     {}},
};

bool called_by_generated_code(const FrameWalkingRuntime& runtime, const std::string& function) {
    for (std::string_view prefix : runtime.prefixes)
        if (function.starts_with(prefix)) return true;
    for (std::string_view part : runtime.parts)
        if (function.find(part) != std::string::npos) return true;
    return false;
}

// Functions that return more than once, or return on another stack than
// the one they were called on: setjmp and its kin save their return
// address in a buffer that longjmp returns through later, vfork's child
// returns through its parent's frame (and its TLS) before the parent does,
// getcontext and swapcontext save theirs in a context resumed later,
// possibly on another thread, and Boost.Context's switches return on the
// stack they switch to.  A hooked return there is the trampoline's address,
// taken again after its return entry was used (perl's and bash's setjmp,
// any program's vfork: SIGSEGV, or the parent running the child's branch).
// Matched as GCC matches its returns_twice functions: the name without its
// leading underscores.
const std::string_view kReturnsTwice[] = {"setjmp",      "sigsetjmp", "savectx",       "vfork",
                                          "getcontext",  "swapcontext", "libc_sigsetjmp", "libc_vfork",
                                          "jump_fcontext", "ontop_fcontext"};

bool returns_twice(std::string_view function) {
    const std::size_t at = function.find_first_not_of('_');
    if (at == std::string_view::npos) return false;
    function.remove_prefix(at);
    return std::find(std::begin(kReturnsTwice), std::end(kReturnsTwice), function) != std::end(kReturnsTwice);
}

// Leaves off the selected exits whose return such a runtime reads; how many.
std::size_t leave_off_exits_runtimes_read(SelectedList& s) {
    std::size_t left_off = 0;
    for (const FrameWalkingRuntime& runtime : kFrameWalkingRuntimes) {
        const bool holds = std::any_of(s.list.probes.begin(), s.list.probes.end(), [&](const probelist::Probe& p) {
            return p.demangled.starts_with(runtime.marker);
        });
        if (!holds) continue;
        left_off += std::erase_if(s.selected, [&](const probelist::Probe* p) {
            return p->kind == probelist::ProbeKind::exit && called_by_generated_code(runtime, p->demangled);
        });
    }
    return left_off;
}

// Leaves off the selected exits of functions that return twice; how many.
std::size_t leave_off_exits_returning_twice(SelectedList& s) {
    return std::erase_if(s.selected, [](const probelist::Probe* p) {
        return p->kind == probelist::ProbeKind::exit && returns_twice(p->function);
    });
}

// The exits no handler may hook, left off and counted.
void leave_off_unhookable_exits(SelectedList& s) {
    s.exits_runtime_reads = leave_off_exits_runtimes_read(s);
    s.exits_return_twice = leave_off_exits_returning_twice(s);
}

// A caller's selections as attach's lists (the lists copied, not reloaded).
// `entries_only` (leaves_exits_off): the count handler leaves the exits of
// the selected functions off, as for a selector's match, unless the
// selection holds exit probes alone (the caller's --exit-only).
std::vector<SelectedList> given_lists(const std::vector<ProbeSelection>& selections, bool entries_only) {
    std::vector<SelectedList> lists;
    std::size_t selected = 0;
    for (const ProbeSelection& sel : selections) {
        if (!sel.list) throw Error("a probe selection of " + sel.source + " has no probe list", ExitCode::bad_input);
        SelectedList& s = lists.emplace_back(SelectedList{sel.source, *sel.list, {}, {}});
        for (std::uint32_t id : sel.probes) {
            if (id >= s.list.probes.size())
                throw Error(sel.source + " has no probe " + std::to_string(id) + " (" +
                                std::to_string(s.list.probes.size()) + " probes)",
                            ExitCode::bad_input);
            s.selected.push_back(&s.list.probes[id]);
        }
    }
    const auto is_exit = [](const probelist::Probe* p) { return p->kind == probelist::ProbeKind::exit; };
    const bool exits_alone = std::all_of(lists.begin(), lists.end(), [&](const SelectedList& s) {
        return std::all_of(s.selected.begin(), s.selected.end(), is_exit);
    });
    for (SelectedList& s : lists) {
        if (entries_only && !exits_alone) s.exits_left_off = std::erase_if(s.selected, is_exit);
        leave_off_unhookable_exits(s);
        selected += s.selected.size();
    }
    if (selected == 0) throw Error("no probe selected", ExitCode::not_found);
    return lists;
}

// `source`'s probes; when it is the process's own `executable` (named by
// nobody) and stripped, the error says so as the user knows the file (not
// as /proc/PID/root/...), and what else there is to probe.
probelist::ProbeList load_executable_or_source(pid_t pid, const std::string& source, const std::string& executable) {
    try {
        return probelist::load_probes_or_symbols(source);
    } catch (const probelist::NoFunctionSymbols&) {
        if (executable.empty()) throw;
        throw Error("process " + std::to_string(pid) + "'s executable " + executable +
                        " has no probes: it was not built with iprobe-cc and is stripped of its function symbols; "
                        "probe a library it loaded with --module NAME (see /proc/" + std::to_string(pid) +
                        "/maps), or install its debug symbols",
                    ExitCode::bad_input);
    }
}

}  // namespace

std::vector<SelectedList> load_lists(const AttachOptions& options) {
    if (!options.selections.empty()) return given_lists(options.selections, leaves_exits_off(options));
    std::vector<std::string> sources = options.probe_sources;
    for (const std::string& name : options.modules) sources.push_back(module_source(options.pid, name));
    std::string executable;  // the process's own, when no source was named
    if (sources.empty()) {
        std::error_code ec;
        const auto exe = std::filesystem::read_symlink("/proc/" + std::to_string(options.pid) + "/exe", ec);
        if (ec) {
            // The target died in the meantime (gone, or a zombie, which has
            // no executable any more): that is "no such process".
            if (ec == std::errc::no_such_file_or_directory || (::kill(options.pid, 0) != 0 && errno == ESRCH))
                throw Error("no process " + std::to_string(options.pid) + " (it exited)", ExitCode::not_found);
            throw Error("cannot read the executable of process " + std::to_string(options.pid), ExitCode::permission);
        }
        executable = exe.string();
        sources.push_back(target_view(options.pid, executable));
    }
    std::vector<SelectedList> lists;
    std::size_t total = 0, selected = 0;
    for (const auto& source : sources) {
        SelectedList s{source, load_executable_or_source(options.pid, source, executable), {}, {}};
        if (s.list.probes.empty()) {
            const std::string named = executable.empty() ? source : executable;
            if (!s.list.refused.empty()) {
                // the most common reason, with its first function
                std::map<std::string, std::size_t> by_reason;
                for (const auto& f : s.list.refused) ++by_reason[f.reason];
                const auto most = std::max_element(by_reason.begin(), by_reason.end(),
                                                   [](auto& a, auto& b) { return a.second < b.second; });
                const auto f = std::find_if(s.list.refused.begin(), s.list.refused.end(),
                                            [&](const auto& r) { return r.reason == most->first; });
                throw Error(named + ": none of its " + std::to_string(s.list.refused.size()) +
                                " functions can be probed (" + std::to_string(most->second) + " " + f->reason +
                                ": " + f->detail + "); 'iprobe list FILE --refused' says why for each",
                            ExitCode::bad_input);
            }
            throw Error(named + ": the probe list is empty; was the binary built with iprobe-cc?", ExitCode::bad_input);
        }
        total += s.list.probes.size();
        lists.push_back(std::move(s));
    }
    std::string refusal;  // the first refused function matched, and why
    const bool entries_only = leaves_exits_off(options);
    for (auto& s : lists) {
        s.selected = options.selector.select(s.list);
        if (entries_only)
            s.exits_left_off = std::erase_if(s.selected, [](const probelist::Probe* p) {
                return p->kind == probelist::ProbeKind::exit;
            });
        leave_off_unhookable_exits(s);
        selected += s.selected.size();
        for (const probelist::RefusedFunction& f : s.list.refused) {
            probelist::Probe as_probe;
            as_probe.function = f.function;
            as_probe.demangled = f.demangled;
            if (!options.selector.matches(as_probe)) continue;
            s.refused.push_back(&f);
            if (refusal.empty()) refusal = f.demangled + ": " + f.reason + " (" + f.detail + ")";
        }
    }
    if (selected == 0) {
        std::size_t refused = 0;
        for (const auto& s : lists) refused += s.refused.size();
        throw Error("no probe matches " + describe_selector(options.selector) + " among " + std::to_string(total) +
                        " probes" +
                        (refused ? "; " + std::to_string(refused) + " matching function(s) cannot be probed, " + refusal
                                 : std::string()) +
                        "; see 'iprobe list " + sources.front() + (refused ? " --refused'" : "'"),
                    ExitCode::not_found);
    }
    return lists;
}

bool leaves_exits_off(const AttachOptions& options) {
    const auto& kinds = options.selector.kinds;
    return options.mode == HandlerMode::count && options.handlers.enter.empty() && !options.count_exits &&
           std::find(kinds.begin(), kinds.end(), probelist::ProbeKind::exit) == kinds.end();
}

std::uint8_t kept_by(HandlerMode mode, std::uint8_t kind, bool exit_times) {
    const std::uint8_t times = mode == HandlerMode::trace && exit_times ? IPROBE_RT_KEPT_TIMES : 0;
    if (kind == static_cast<std::uint8_t>(probelist::ProbeKind::exit)) return IPROBE_RT_KEPT_COMPLETED | times;
    if (kind == static_cast<std::uint8_t>(probelist::ProbeKind::entry)) return IPROBE_RT_KEPT_CALLS | times;
    return IPROBE_RT_KEPT_CALLS;
}

std::string hex_id(const std::vector<std::uint8_t>& id) { return id.empty() ? "(none)" : probelist::hex(id); }

const RunningModule& match_module(const SelectedList& s, const std::vector<RunningModule>& modules, pid_t pid) {
    for (const auto& m : modules)
        if (!s.list.build_id.empty() && m.build_id == s.list.build_id) return m;
    const std::string name = basename_of(s.list.module);
    for (const auto& m : modules)
        if (basename_of(m.path) == name)
            throw Error(s.source + " was made for build-id " + s.list.build_id_hex() + " but " + m.path +
                            " running in process " + std::to_string(pid) + " has build-id " + hex_id(m.build_id) +
                            ": use the probe list of the running build",
                        ExitCode::bad_input);
    if (!(s.list.flags & IPROBE_PL_FLAG_SHARED)) {
        std::error_code ec;
        const auto exe = std::filesystem::read_symlink("/proc/" + std::to_string(pid) + "/exe", ec).string();
        for (const auto& m : modules)
            if (!ec && m.path == exe)
                throw Error(s.source + " describes executable " + s.list.module + " (build-id " + s.list.build_id_hex() +
                                ") but process " + std::to_string(pid) + " runs " + m.path + " (build-id " +
                                hex_id(m.build_id) + "): use the probe list of the running build",
                            ExitCode::bad_input);
    }
    throw Error("module " + s.list.module + " (build-id " + s.list.build_id_hex() + ") of " + s.source +
                    " is not loaded in process " + std::to_string(pid),
                ExitCode::not_found);
}

void assign_stats(Region& region, const RunningModule& running, const probelist::ProbeList& list, std::uint32_t first_probe) {
    std::uint32_t next = region.stat_count();
    std::map<std::string, std::uint32_t> by_function;
    iprobe_rt_probe* probes = region.probes();
    for (const auto& p : list.probes) {
        std::uint32_t stat;
        if (p.kind == probelist::ProbeKind::point) {
            stat = next++;
        } else {
            const std::string key = p.function_address ? std::to_string(p.function_address) : p.function;
            auto [it, fresh] = by_function.try_emplace(key, next);
            if (fresh) next++;
            stat = it->second;
        }
        if (stat >= region.stat_capacity())
            throw Error("the iprobe region of this process has no aggregate slots left for " + running.path +
                        "; restart the process to attach more modules");
        probes[first_probe + p.id].stat = stat;
    }
    __atomic_store_n(&region.control()->stat_count, next, __ATOMIC_RELEASE);
}

std::uint64_t realtime_ns() {
    timespec ts{};
    ::clock_gettime(CLOCK_REALTIME, &ts);
    return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

void set_live(iprobe_rt_probe& probe, bool live, std::uint64_t now_ns) {
    if (live && !probe.enabled) probe.live_since_ns = now_ns;
    if (!live && probe.enabled && probe.live_since_ns) {
        probe.live_ns += now_ns > probe.live_since_ns ? now_ns - probe.live_since_ns : 0;
        probe.live_since_ns = 0;
    }
    probe.enabled = live ? 1 : 0;
}

void update_timed(Region& region) {
    iprobe_rt_probe* probes = region.probes();
    const std::uint32_t count = region.probe_count();
    // per function (stat): how its enabled exit is kept (IPROBE_RT_UNTIMED: none on)
    std::vector<std::uint8_t> exit_on(region.stat_capacity(), IPROBE_RT_UNTIMED);
    for (std::uint32_t i = 0; i < count; i++)
        if (probes[i].enabled && probes[i].kind == static_cast<std::uint8_t>(probelist::ProbeKind::exit) &&
            probes[i].stat < exit_on.size())
            exit_on[probes[i].stat] =
                probes[i].timed == IPROBE_RT_EXIT_UNSTAMPED ? IPROBE_RT_EXIT_UNSTAMPED : IPROBE_RT_TIMED;
    for (std::uint32_t i = 0; i < count; i++)
        if (probes[i].kind == static_cast<std::uint8_t>(probelist::ProbeKind::entry))
            probes[i].timed = probes[i].stat < exit_on.size() ? exit_on[probes[i].stat] : std::uint8_t{IPROBE_RT_UNTIMED};
}

void warm_probes(const Region& region) {
    const auto* table = reinterpret_cast<const char*>(region.probes());
    const std::size_t bytes = std::size_t{region.probe_count()} * sizeof(iprobe_rt_probe);
    for (std::size_t at = 0; at < bytes; at += 64) __builtin_prefetch(table + at, 1, 3);
}

void check_sites_in_code(const SelectedList& s, const RunningModule& running) {
    for (const auto& p : s.list.probes)
        if (!running.holds_code(p.site, p.size))
            throw Error(s.source + ": record " + std::to_string(p.id) + ": site_address " + hex_address(p.site) +
                            " is outside the executable segments of " + running.path +
                            "; the probe list is corrupt or not made for this build",
                        ExitCode::bad_input);
}

void check_site_bytes(const SelectedList& s, const RunningModule& running, const probelist::Probe& p, std::uint64_t site,
                      const std::uint8_t* now, StubChecker& stubs_seen) {
    if (std::memcmp(now, p.placeholder.data(), p.size) == 0 || stubs_seen.calls_a_stub(site, now, p.size) ||
        (std::memcmp(now, p.original.data(), p.size) == 0 && p.form != probelist::SiteForm::nop))
        return;
    std::ostringstream bytes;
    for (int i = 0; i < p.size; i++) bytes << (i ? " " : "") << std::hex << int(now[i]);
    // An int3 where the file has another byte: someone's breakpoint.
    const auto& expected = p.form == probelist::SiteForm::nop ? p.placeholder : p.original;
    for (int i = 0; i < p.size; i++)
        if (now[i] == 0xcc && expected[i] != 0xcc)
            throw Error("site " + hex_address(site) + " in " + p.demangled + " holds [" + bytes.str() + "]: a breakpoint " +
                            "(int3) is on it, a uprobe's (bpftrace, perf probe, SystemTap) or a debugger's; remove it, " +
                            "or leave " + p.demangled + " out (--functions), and attach again",
                        ExitCode::busy);
    throw Error(s.source + ": record " + std::to_string(p.id) + ": site " + hex_address(site) + " in " + p.demangled +
                    " holds [" + bytes.str() + "], neither its placeholder nor an iprobe call: " + running.path +
                    " is not the coldpatched binary " + s.source + " describes",
                ExitCode::bad_input);
}

EntryVariant live_variant(const SelectedList& s, const RunningModule& running, const probelist::Probe& entry,
                          std::uint64_t site, const std::uint8_t* now, StubChecker& stubs_seen) {
    if (std::memcmp(now, entry.placeholder.data(), entry.size) == 0) return {};
    if (stubs_seen.calls_a_stub(site, now, entry.size)) {
        if (auto v = variant_at(called_stub(site, now, entry.size), entry.id)) return *v;
        throw Error("the entry of " + entry.demangled + " at " + hex_address(site) +
                        " was enabled through a shared stub (a handler without entry points for function-entry "
                        "sites); detach it first",
                    ExitCode::busy);
    }
    check_site_bytes(s, running, entry, site, now, stubs_seen);
    return {};
}

void require_same_stubs(const ProcessMemory& memory, const probelist::Probe& entry, std::uint64_t entry_slot,
                        std::uint64_t exit_slot, const EntrySiteStubs& stubs) {
    std::array<std::uint8_t, kSiteStubSize> held{};
    for (const auto& [at, want] : {std::pair{entry_slot, &stubs.entry_slot}, std::pair{exit_slot, &stubs.exit_slot}}) {
        memory.read(at, held.data(), held.size());
        if (held != *want)
            throw Error(entry.demangled + " is enabled with another handler; detach it first (iprobe detach PID "
                        "--functions '" + entry.demangled + "')",
                        ExitCode::busy);
    }
}

EntrySitePlan plan_entry_site(const SelectedList& s, const RunningModule& running, const iprobe_rt_module& module,
                              std::uint32_t entry_id, std::uint32_t id, EntryVariant wanted, const std::uint8_t* now,
                              const EntrySiteHandlers& handlers, const ProcessMemory& memory, StubChecker& stubs_seen) {
    const probelist::Probe& entry = s.list.probes[entry_id];
    const std::uint64_t site = running.load_bias + entry.site;
    EntrySitePlan plan;
    plan.before = live_variant(s, running, entry, site, now, stubs_seen);
    plan.after = plan.before | wanted;
    if (variant_symbol(handlers.symbols, plan.after).empty())
        throw Error("the handler library has no entry point for the " +
                        std::string(plan.after.enter ? "entry and exit" : "exit") + " of " + entry.demangled +
                        " (a function-entry site whose exit is a return trampoline)",
                    ExitCode::unavailable);
    // A relocated entry goes on through its trampoline, a pad right after itself.
    if (entry.relocated) plan.trampoline = relocated_trampoline(module, entry, site);
    const EntrySiteStubs stubs = entry_site_stubs(id, handlers.targets, handlers.inline_count_tpoff, module.site_stubs,
                                                  entry_id, plan.trampoline ? plan.trampoline->address : site + entry.size);
    plan.entry_slot = {module.site_stubs, variant_stub(module.site_stubs, entry_id, {true, false}), stubs.entry_slot};
    plan.exit_slot = {module.site_stubs, variant_stub(module.site_stubs, entry_id, {false, true}), stubs.exit_slot};
    if (plan.before.any()) {
        require_same_stubs(memory, entry, plan.entry_slot.address, plan.exit_slot.address, stubs);
        if (plan.trampoline) require_same_trampoline(memory, entry, *plan.trampoline);
    }
    if (plan.after != plan.before)
        plan.patch = Patch{site, SiteBytes(now, entry.size),
                           jump_bytes(site, entry.size, variant_stub(module.site_stubs, entry_id, plan.after))};
    return plan;
}

void check_selected_sites(const ProcessMemory& memory, const SelectedList& s, const RunningModule& running) {
    check_sites_in_code(s, running);
    std::vector<std::uint64_t> addresses;
    addresses.reserve(s.selected.size());
    for (const probelist::Probe* p : s.selected) addresses.push_back(running.load_bias + p->site);
    const std::vector<SiteText> text = read_sites(memory, addresses);
    StubChecker stubs_seen(memory);
    for (std::size_t k = 0; k < s.selected.size(); k++)
        check_site_bytes(s, running, *s.selected[k], addresses[k], text[k].data(), stubs_seen);
}

std::optional<std::uint32_t> find_module(const Region& region, const RunningModule& running, const SelectedList& s) {
    const iprobe_rt_module* mods = region.modules();
    for (std::uint32_t i = 0; i < region.module_count(); i++)
        if (mods[i].load_bias == running.load_bias &&
            running.path == std::string(mods[i].path, ::strnlen(mods[i].path, sizeof mods[i].path)) &&
            mods[i].probe_count == s.list.probes.size()) {
            if (mods[i].first_probe > region.probe_capacity() ||
                mods[i].probe_count > region.probe_capacity() - mods[i].first_probe)
                throw Error("the iprobe region of process has an inconsistent module table (corrupted?)",
                            ExitCode::bad_input);
            return i;
        }
    return std::nullopt;
}

std::uint32_t find_or_add_module(Region& region, const RunningModule& running, const SelectedList& s) {
    if (const auto found = find_module(region, running, s)) return *found;
    iprobe_rt_control* cb = region.control();
    iprobe_rt_module* mods = region.modules();
    if (region.module_count() >= cb->module_capacity || cb->module_count >= cb->module_capacity)
        throw Error("too many modules attached in this process");
    if (region.probe_count() + s.list.probes.size() > region.probe_capacity())
        throw Error("the iprobe region of this process was sized for " + std::to_string(cb->probe_capacity) +
                    " probes at first attach; restart the process to attach more modules");
    const std::uint32_t index = cb->module_count;
    iprobe_rt_module& m = mods[index];
    std::memset(&m, 0, sizeof m);
    std::strncpy(m.path, running.path.c_str(), sizeof m.path - 1);
    const std::string probes_path = canonical_or_same(s.source);
    std::strncpy(m.probes_path, probes_path.c_str(), sizeof m.probes_path - 1);
    m.build_id_size = static_cast<std::uint32_t>(std::min<std::size_t>(running.build_id.size(), sizeof m.build_id));
    std::memcpy(m.build_id, running.build_id.data(), m.build_id_size);
    m.first_probe = region.probe_count();
    m.probe_count = static_cast<std::uint32_t>(s.list.probes.size());
    m.load_bias = running.load_bias;
    iprobe_rt_probe* probes = region.probes();
    for (const auto& p : s.list.probes) {
        iprobe_rt_probe& rp = probes[m.first_probe + p.id];
        rp = {};
        rp.module = index;
        rp.id = p.id;
        rp.kind = static_cast<std::uint8_t>(p.kind);
        rp.form = static_cast<std::uint8_t>(p.form);
        rp.size = p.size;
        rp.function = p.function_address <= UINT32_MAX ? static_cast<std::uint32_t>(p.function_address) : 0;
        rp.site = running.load_bias + p.site;
        rp.stat = IPROBE_RT_NO_STAT;
    }
    assign_stats(region, running, s.list, m.first_probe);
    cb->probe_count = m.first_probe + m.probe_count;
    cb->module_count = index + 1;
    return index;
}

}  // namespace iprobe::hotpatch
