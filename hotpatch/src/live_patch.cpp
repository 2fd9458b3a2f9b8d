// iprobe patch: plan while the target runs (which entry, which replacement,
// do their signatures agree), then stop the world once, load the libraries
// that are missing, write the stubs and the entries (redirects.h).
#include "iprobe/hotpatch/live_patch.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <set>

#include "attach_plan.h"
#include "inject.h"
#include "iprobe/elf/function_signature.h"
#include "iprobe/probelist/probe_source.h"
#include "iprobe/support/error.h"
#include "modules.h"
#include "patch.h"
#include "redirects.h"
#include "region.h"
#include "seccomp_check.h"
#include "session.h"
#include "stubs.h"

namespace iprobe::hotpatch {

namespace {

// A module of the process and the probe list describing its build.
struct ListedModule {
    RunningModule running;
    probelist::ProbeList list;
};

std::vector<ListedModule> listed_modules(pid_t pid, const ProcessMemory& memory, const std::vector<std::string>& sources) {
    const std::vector<RunningModule> running = running_modules(memory, read_maps(pid));
    std::vector<ListedModule> out;
    if (!sources.empty()) {
        for (const std::string& source : sources) {
            SelectedList s{source, probelist::load_probes(source), {}, {}};
            out.push_back({match_module(s, running, pid), std::move(s.list)});
        }
        return out;
    }
    for (const RunningModule& m : running) {
        if (runtime_file_name(basename_of(m.path)) || m.build_id.empty()) continue;
        auto list = prepared_probe_list_at(target_view(pid, m.path));  // patches need pads
        if (list && list->build_id == m.build_id) out.push_back({m, std::move(*list)});
    }
    return out;
}

bool is_entry_site(const probelist::ProbeList& list, const probelist::Probe& p) {
    return p.kind == probelist::ProbeKind::entry && p.form == probelist::SiteForm::nop && p.size == 5 &&
           probelist::serves_returns(list.probes, p.id);
}

bool names(const probelist::Probe& p, const std::string& name) {
    if (p.function == name || p.demangled == name) return true;
    const auto paren = p.demangled.find('(');
    return paren != std::string::npos && paren == name.size() && p.demangled.compare(0, paren, name) == 0;
}

struct EntrySite {
    const ListedModule* module = nullptr;
    const probelist::Probe* probe = nullptr;
    std::uint64_t address = 0;
};

std::string module_names(const std::vector<ListedModule>& modules) {
    std::string out;
    for (const auto& m : modules) out += (out.empty() ? "" : ", ") + m.running.path;
    return out.empty() ? "(none: no module of the process has a probe list; was it built with iprobe-cc?)" : out;
}

// Every entry probe of a function named `name`, one per function.
std::vector<EntrySite> entries_named(const std::vector<ListedModule>& modules, const std::string& name) {
    std::vector<EntrySite> out;
    for (const ListedModule& m : modules) {
        std::set<std::uint64_t> seen;
        for (const probelist::Probe& p : m.list.probes)
            if (p.kind == probelist::ProbeKind::entry && names(p, name) && seen.insert(p.function_address ? p.function_address : p.site).second)
                out.push_back({&m, &p, m.running.load_bias + p.site});
    }
    return out;
}

// The one function `name` means; `avoid` are modules that only hold
// replacements (tried last, so a fix named like the function does not make
// it ambiguous).
EntrySite find_function(const std::vector<ListedModule>& modules, const std::string& name, pid_t pid,
                        const std::set<std::string>& avoid) {
    std::vector<EntrySite> found = entries_named(modules, name);
    if (found.size() > 1) {
        std::vector<EntrySite> preferred;
        for (const auto& e : found)
            if (!avoid.count(e.module->running.path)) preferred.push_back(e);
        if (!preferred.empty()) found = preferred;
    }
    if (found.empty())
        throw Error("no function " + name + " among the probes of process " + std::to_string(pid) + " (" +
                        module_names(modules) + "); see 'iprobe list BINARY'",
                    ExitCode::not_found);
    if (found.size() > 1) {
        std::string where;
        for (const auto& e : found) where += "\n  " + e.probe->demangled + " in " + e.module->running.path;
        throw Error(name + " names " + std::to_string(found.size()) + " functions:" + where +
                        "\nname one by its full (demangled) name, or its module with --probes MODULE",
                    ExitCode::bad_input);
    }
    const EntrySite& e = found.front();
    if (!e.module->running.holds_code(e.probe->site, e.probe->size))
        throw Error("the probe list of " + e.module->running.path + " puts " + e.probe->demangled +
                        " outside its code: it is corrupt or of another build",
                    ExitCode::bad_input);
    if (!is_entry_site(e.module->list, *e.probe)) {
        if (e.module->list.flow == IPROBE_FLOW_FINSTRUMENT)
            throw Error(e.probe->demangled + " in " + e.module->running.path +
                            " was built with -finstrument-functions (iprobe-cc --flow=finstrument): its probe site is a "
                            "call after the function's prologue, not its entry, and jumping away from there would "
                            "leave the prologue's frame behind. Rebuild with iprobe-cc's default entry flow (or "
                            "--flow=llvm) to patch it",
                        ExitCode::bad_input);
        throw Error("the probe of " + e.probe->demangled + " in " + e.module->running.path +
                        " is not a 5-byte NOP at its entry; only function entries of the entry and LLVM flows can be patched",
                    ExitCode::bad_input);
    }
    return e;
}

// Functions the runtime itself calls: patching one could make its own
// handlers (or a probe on the replacement) run the replacement.
std::set<std::string> runtime_imports() {
    std::set<std::string> out;
    try {
        const elf::ElfFile runtime(default_runtime_library());
        for (const elf::ElfSymbol& s : runtime.symbols())
            if (!s.defined() && s.dynamic && !s.name.empty()) out.insert(s.name);
    } catch (const Error&) {
        // No runtime at hand: nothing of it can be in the way either.
    }
    return out;
}

std::string library_path(const std::string& given) {
    struct stat st {};
    if (::stat(given.c_str(), &st) != 0)
        throw Error("replacement library " + given + " not found", ExitCode::not_found);
    if (!S_ISREG(st.st_mode)) throw Error(given + " is not a regular file", ExitCode::bad_input);
    return canonical_or_same(given);
}

struct PlannedPatch {
    EntrySite site;
    std::string library, symbol;
    PatchedFunction report;
};

// Reads one entry site of the stopped target: what it redirects to now, if
// anything; throws when it is neither free nor redirected.
std::optional<Redirect> entry_state(const StoppedProcess& process, const EntrySite& e, std::uint8_t (&now)[5],
                                    StubChecker& stubs) {
    process.read(e.address, now, sizeof now);
    if (std::memcmp(now, e.probe->placeholder.data(), 5) == 0) return std::nullopt;
    if (auto r = redirect_at(process.memory(), e.address, now, 5, stubs)) return r;
    if (stubs.calls_a_stub(e.address, now, 5))
        throw Error(e.probe->demangled + " has probes enabled; detach them first (iprobe detach " +
                        std::to_string(process.pid()) + " --functions '" + e.probe->demangled +
                        "'), then patch, then probe the replacement (iprobe attach --probes LIB.so)",
                    ExitCode::busy);
    throw Error("the entry of " + e.probe->demangled + " at " + hex_address(e.address) +
                    " holds neither its NOP nor a jump: " + e.module->running.path +
                    " is not the build its probe list describes, or another tool patched it",
                ExitCode::bad_input);
}

std::string symbol_at(pid_t pid, const std::vector<RunningModule>& running, std::uint64_t address, std::string* module) {
    for (const RunningModule& m : running)
        if (address >= m.low && address < m.high) {
            *module = m.path;
            try {
                const auto elf = elf_cache().get(pid, m.path);
                if (const elf::ElfSymbol* s = elf->function_starting_at(address - m.load_bias)) return s->name;
            } catch (const Error&) {
            }
            return {};
        }
    return {};
}

// Every function entry of `modules` that holds a redirect, with it.
std::vector<std::pair<EntrySite, Redirect>> redirected_entries(const ProcessMemory& memory,
                                                               const std::vector<ListedModule>& modules) {
    std::vector<std::pair<EntrySite, Redirect>> out;
    StubChecker stubs(memory);
    for (const ListedModule& m : modules) {
        std::vector<EntrySite> sites;
        std::vector<std::uint64_t> addresses;
        for (const probelist::Probe& p : m.list.probes)
            if (is_entry_site(m.list, p) && m.running.holds_code(p.site, p.size)) {
                sites.push_back({&m, &p, m.running.load_bias + p.site});
                addresses.push_back(sites.back().address);
            }
        const std::vector<SiteText> text = read_sites(memory, addresses);
        for (std::size_t k = 0; k < sites.size(); k++)
            if (auto r = redirect_at(memory, addresses[k], text[k].data(), 5, stubs)) out.emplace_back(sites[k], *r);
    }
    return out;
}

PatchedFunction describe(pid_t pid, const std::vector<RunningModule>& running, const EntrySite& e, const Redirect& r) {
    PatchedFunction f;
    f.function = e.probe->demangled;
    f.module = e.module->running.path;
    f.entry = e.address;
    f.replacement = r.target;
    f.stub = r.stub;
    f.symbol = symbol_at(pid, running, r.target, &f.library);
    return f;
}

// Where both have DWARF, F and its replacement must agree on what they take
// and return; records how they compared.
void compare_signatures(PlannedPatch& p, pid_t pid, const elf::ElfFile& library, std::uint64_t replacement, bool force) {
    const probelist::Probe& probe = *p.site.probe;
    std::optional<std::string> mine;
    try {
        // The entry site is the function's first instruction: its link address is the function's.
        mine = elf::function_signature(*elf_cache().get(pid, p.site.module->running.path), probe.site);
    } catch (const Error&) {
    }
    const std::optional<std::string> theirs = elf::function_signature(library, replacement);
    p.report.signature = mine.value_or("");
    if (!mine || !theirs) {
        p.report.signature_check = "unchecked";
    } else if (*mine == *theirs) {
        p.report.signature_check = "match";
    } else if (force) {
        p.report.signature_check = "forced";
    } else {
        throw Error("signatures differ: " + probe.demangled + " is " + *mine + " but " + p.symbol + " in " + p.library +
                        " is " + *theirs + "; nothing was patched (--force patches anyway)",
                    ExitCode::bad_input);
    }
}

// One --function/--with pair checked, while the target runs.
struct PatchPlanner {
    PatchPlanner(const PatchOptions& o, const std::vector<ListedModule>& m) : options(o), modules(m) {
        // A replacement's own module is looked at last when naming F.
        for (const FunctionPatch& fp : o.patches) replacement_modules.insert(library_path(fp.library));
    }
    const PatchOptions& options;
    const std::vector<ListedModule>& modules;
    const std::set<std::string> imports = runtime_imports();
    std::set<std::string> replacement_modules;
    std::map<std::string, std::unique_ptr<elf::ElfFile>> libraries;

    PlannedPatch plan(const FunctionPatch& fp) {
        PlannedPatch p;
        p.library = library_path(fp.library);
        p.site = find_function(modules, fp.function, options.pid, replacement_modules);
        const probelist::Probe& probe = *p.site.probe;
        if (imports.count(probe.function))
            throw Error(probe.demangled + " is called by the iprobe runtime itself (" + std::string(kRuntimeName) +
                            "): replacing it could run the replacement inside the probes' own handlers; not patched",
                        ExitCode::bad_input);
        if (p.library == canonical_or_same(p.site.module->running.path))
            throw Error(p.library + " is the module that holds " + probe.demangled + " itself", ExitCode::bad_input);
        auto& lib = libraries[p.library];
        if (!lib) {
            lib = std::make_unique<elf::ElfFile>(p.library);
            if (!lib->is_x86_64() || !lib->is_position_independent())
                throw Error(p.library + " is not an x86-64 shared object (build it with iprobe-cc -shared -fPIC)",
                            ExitCode::bad_input);
        }
        p.symbol = fp.symbol.empty() ? probe.function : fp.symbol;
        const elf::ElfSymbol* replacement = lib->symbol_named(p.symbol);
        if (!replacement || !replacement->defined() || !replacement->is_function())
            throw Error(p.library + " defines no function " + p.symbol + " (see nm -D " + p.library + ")",
                        ExitCode::not_found);
        p.report.function = probe.demangled;
        p.report.module = p.site.module->running.path;
        p.report.entry = p.site.address;
        p.report.library = p.library;
        p.report.symbol = p.symbol;
        compare_signatures(p, options.pid, *lib, replacement->address, options.force);
        return p;
    }
};

}  // namespace

PatchStats patch(const PatchOptions& o) {
    check_target(o.pid);
    target_owner(o.pid);
    if (o.patches.empty()) throw Error("nothing to patch: give --function F --with LIB.so[:SYMBOL]", ExitCode::usage);
    SessionLock lock(o.pid);
    const ProcessMemory memory(o.pid);
    const std::vector<ListedModule> modules = listed_modules(o.pid, memory, o.probe_sources);
    PatchPlanner planner(o, modules);
    std::vector<PlannedPatch> plan;
    for (const FunctionPatch& fp : o.patches) {
        PlannedPatch p = planner.plan(fp);
        for (const PlannedPatch& earlier : plan)
            if (earlier.site.address == p.site.address)
                throw Error(p.report.function + " is patched twice in one command", ExitCode::usage);
        plan.push_back(std::move(p));
    }
    const auto& libraries = planner.libraries;

    std::set<std::string> injected;
    for (const auto& m : read_maps(o.pid))
        if (basename_of(m.path).rfind("libc.so", 0) == 0) elf_cache().preload(o.pid, m.path);
    PatchStats stats = with_world_stopped(o.pid, o.safe_point_timeout, [&](StoppedProcess& process,
                                                                          Clock::time_point started,
                                                                          Clock::time_point deadline) {
        PatchStats st;
        st.threads = process.threads().size();
        auto maps = read_maps(o.pid);
        auto running = running_modules(process.memory(), maps);
        const LoadedLibrary libc = libc_of(o.pid, running);
        // Where the remote dlopen returns, whatever becomes of this tool
        // (docs/hotpatch.md, "Function calls inside a target").
        refuse_if_seccomp_forbids(process);
        use_landings(process, libc, find_loaded(o.pid, running, default_runtime_library()));
        std::map<std::string, LoadedLibrary> loaded;
        for (const auto& [path, elf] : libraries) {
            Injected in = ensure_library(process, maps, running, libc, path, deadline);
            if (in.injected) injected.insert(path);
            loaded[path] = in.library;
        }
        StubChecker stubs(process.memory());
        std::vector<Patch> patches;
        for (PlannedPatch& p : plan) {
            std::uint8_t now[5];
            entry_state(process, p.site, now, stubs);
            const auto replacement = loaded[p.library].symbol(p.symbol);
            if (!replacement) throw Error(p.library + " defines no function " + p.symbol, ExitCode::not_found);
            const RunningModule* module = nullptr;
            for (const RunningModule& m : running)
                if (m.build_id == p.site.module->running.build_id && m.path == p.site.module->running.path) module = &m;
            if (!module) throw Error(p.site.module->running.path + " is no longer mapped in process " + std::to_string(o.pid));
            p.report.replacement = *replacement;
            p.report.stub = within_rel32(p.site.address + 5, *replacement) ? 0 : patch_stub_for(process, libc, *module, *replacement);
            patches.push_back({p.site.address, SiteBytes(now, 5),
                               jump_bytes(p.site.address, 5, p.report.stub ? p.report.stub : *replacement)});
        }
        sort_by_address(patches);
        if (!unsafe_pcs(process, patches).empty()) throw RetryLater{};
        throw_if_interrupted();
        apply_patches(process, patches);
        st.stop_us = process.stop_us;
        process.release();
        st.pause_us = elapsed_us(started);
        return st;
    });
    for (const PlannedPatch& p : plan) stats.patched.push_back(p.report);
    stats.injected.assign(injected.begin(), injected.end());
    return stats;
}

RevertStats revert(const RevertOptions& o) {
    check_target(o.pid);
    target_owner(o.pid);
    SessionLock lock(o.pid);
    const ProcessMemory memory(o.pid);
    const std::vector<ListedModule> modules = listed_modules(o.pid, memory, o.probe_sources);
    const auto redirected = redirected_entries(memory, modules);
    const std::vector<RunningModule> running = running_modules(memory, read_maps(o.pid));
    std::vector<std::pair<EntrySite, Redirect>> chosen;
    if (o.functions.empty()) {
        chosen = redirected;
    } else {
        for (const std::string& name : o.functions) {
            std::vector<std::pair<EntrySite, Redirect>> hits;
            for (const auto& r : redirected)
                if (names(*r.first.probe, name)) hits.push_back(r);
            if (hits.empty())
                throw Error(name + " is not patched in process " + std::to_string(o.pid) + " (see iprobe status " +
                                std::to_string(o.pid) + ")",
                            ExitCode::not_found);
            if (hits.size() > 1)
                throw Error(name + " names " + std::to_string(hits.size()) +
                                " patched functions; name one by its full (demangled) name",
                            ExitCode::bad_input);
            chosen.push_back(hits.front());
        }
    }
    RevertStats stats;
    for (const auto& [site, redirect] : chosen) stats.reverted.push_back(describe(o.pid, running, site, redirect));
    if (chosen.empty()) return stats;
    std::vector<Patch> patches;
    for (const auto& [site, redirect] : chosen) {
        const SiteBytes now = jump_bytes(site.address, 5, redirect.stub ? redirect.stub : redirect.target);
        patches.push_back({site.address, now, SiteBytes(site.probe->placeholder.data(), 5)});
    }
    sort_by_address(patches);
    const RevertStats timing = with_world_stopped(o.pid, o.safe_point_timeout, [&](StoppedProcess& process,
                                                                                   Clock::time_point started,
                                                                                   Clock::time_point) {
        RevertStats st;
        st.threads = process.threads().size();
        if (!unsafe_pcs(process, patches).empty()) throw RetryLater{};
        throw_if_interrupted();
        apply_patches(process, patches);  // checks each entry still holds the jump read above
        st.stop_us = process.stop_us;
        process.release();
        st.pause_us = elapsed_us(started);
        return st;
    });
    stats.threads = timing.threads;
    stats.pause_us = timing.pause_us;
    stats.stop_us = timing.stop_us;
    return stats;
}

std::vector<PatchedFunction> patched_functions(pid_t pid) {
    check_target(pid);
    const ProcessMemory memory(pid);
    const std::vector<ListedModule> modules = listed_modules(pid, memory, {});
    const std::vector<RunningModule> running = running_modules(memory, read_maps(pid));
    std::vector<PatchedFunction> out;
    for (const auto& [site, redirect] : redirected_entries(memory, modules))
        out.push_back(describe(pid, running, site, redirect));
    return out;
}

}  // namespace iprobe::hotpatch
