#include "values_plan.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "iprobe/elf/function_values.h"
#include "iprobe/support/error.h"
#include "iprobe/support/proc.h"
#include "inject.h"
#include "modules.h"
#include "process.h"

namespace iprobe::hotpatch {

std::shared_ptr<elf::ElfFile> module_of(pid_t pid, const SelectedList& s) {
    for (const auto& m : read_maps(pid))
        if (!m.path.empty() && (m.path == s.list.module || basename_of(m.path) == basename_of(s.list.module))) try {
                return elf_cache().get(pid, m.path);
            } catch (const Error&) {
            }
    return nullptr;
}

std::shared_ptr<elf::ElfFile> dwarf_of(pid_t pid, const SelectedList& s) {
    std::shared_ptr<elf::ElfFile> module = module_of(pid, s);
    if (!module) return nullptr;
    const auto path = elf::debug_file_for(*module);
    if (!path) return nullptr;
    if (*path == module->path()) return module;
    try {  // kept, as the module is: its DWARF is indexed once (attach_conditions reads it too)
        return elf_cache().get(pid, *path);
    } catch (const Error&) {
        return nullptr;
    }
}

std::uint64_t spec_word(const iprobe_rt_values_spec& spec) {
    std::uint64_t w;
    static_assert(sizeof w == sizeof spec);
    std::memcpy(&w, &spec, sizeof w);
    return w;
}

bool at_site_entry(const probelist::Probe& p) {
    return p.kind == probelist::ProbeKind::entry && p.form != probelist::SiteForm::nop &&
           p.form != probelist::SiteForm::ret;
}

std::optional<elf::FunctionValues> values_for(const elf::ElfFile& dwarf, const elf::ElfFile* module,
                                              const probelist::Probe& p) {
    if (!p.function_address) return std::nullopt;
    std::optional<elf::Site> site;
    if (at_site_entry(p)) site = elf::Site{p.site, module};
    return elf::function_values(dwarf, p.function_address, p.function, site);
}

namespace {

iprobe_rt_location location_of(const elf::SiteLocation& at) {
    using K = elf::SiteLocation::Kind;
    iprobe_rt_location l{};
    l.reg = at.reg;
    l.offset = static_cast<std::int16_t>(at.offset);
    switch (at.kind) {
    case K::reg: l.kind = IPROBE_RT_LOC_REG; break;
    case K::memory: l.kind = static_cast<std::uint8_t>(IPROBE_RT_LOC_MEMORY | at.size << 4); break;
    case K::value: l.kind = IPROBE_RT_LOC_VALUE; break;
    case K::constant: l.kind = IPROBE_RT_LOC_CONST; break;
    }
    return l;
}

// The exit probes of each function, by its address: the exit hooks of its
// body and of its cold part (gcc's .text.unlikely: exception cleanups).
std::map<std::uint64_t, std::vector<std::uint32_t>> exits_by_function(const probelist::ProbeList& list) {
    std::map<std::uint64_t, std::vector<std::uint32_t>> out;
    for (const auto& p : list.probes)
        if (p.kind == probelist::ProbeKind::exit && p.function_address) out[p.function_address].push_back(p.id);
    return out;
}

}  // namespace

iprobe_rt_site_recipe site_recipe(const elf::FunctionValues& values) {
    iprobe_rt_site_recipe r{};
    for (const auto& p : values.params)
        for (std::size_t i = 0; i < p.parts.size() && i < p.at_site.size(); i++) {
            const elf::ValuePart& part = p.parts[i];
            if (part.vector ? part.reg < IPROBE_RT_VALUES_XMMS : part.reg < IPROBE_RT_VALUES_GPRS)
                (part.vector ? r.xmm : r.gpr)[part.reg] = location_of(p.at_site[i]);
        }
    if (values.return_slot) r.return_slot = location_of(*values.return_slot);
    return r;
}

ValuesPlan plan_values(pid_t pid, const SelectedList& s, const ValueOptions& options, bool conditioned) {
    ValuesPlan plan;
    if (!options.any() && !conditioned) return plan;
    std::shared_ptr<elf::ElfFile> dwarf, module;
    bool dwarf_tried = false;
    auto load = [&] {
        if (!dwarf_tried) dwarf = dwarf_of(pid, s), module = module_of(pid, s), dwarf_tried = true;
    };
    std::set<std::uint32_t> selected;
    for (const probelist::Probe* p : s.selected) selected.insert(p->id);
    std::optional<std::map<std::uint64_t, std::vector<std::uint32_t>>> exits_of;
    // -finstrument-functions entries first: whether each hooks its return
    // decides what its exit probes do.
    for (const probelist::Probe* p : s.selected) {
        if (!at_site_entry(*p)) continue;
        load();
        std::optional<elf::FunctionValues> typed;
        if (dwarf) typed = values_for(*dwarf, module.get(), *p);
        if (!typed) {  // raw arg0..arg5 are not in their registers after the prologue
            if (options.any()) plan.unavailable++;
            continue;
        }
        iprobe_rt_values_spec spec{};
        spec.flags = IPROBE_RT_VALUES_AT_SITE;
        // its hook's frame is its host's: the trace nests it there (CallNesting)
        if (typed->inlined) spec.flags |= IPROBE_RT_VALUES_COPY;
        if (!exits_of) exits_of = exits_by_function(s.list);
        const auto found = exits_of->find(p->function_address);
        std::vector<std::uint32_t> exits;  // the hooks in its own code, not an inlined copy's
        std::vector<std::uint32_t> copy_exits;  // an inlined copy's: its exit hooks (no return to hook)
        if (found != exits_of->end())
            for (std::uint32_t e : found->second) {
                const bool here = typed->holds(s.list.probes[e].site);
                if (here && !typed->inlined) exits.push_back(e);
                if (!here || typed->inlined) plan.inlined_exits.insert(e);
                if (here && typed->inlined) copy_exits.push_back(e);
            }
        // The trampoline records the exit as one of them, spec.distance ahead
        // (an inlined copy's hooks may come between)
        // (the first after the entry: a cold part's, exception cleanups, may lie before it)
        std::uint32_t first = 0;
        for (std::uint32_t e : exits)
            if (e > p->id && (!first || e < first)) first = e;
        bool hook = typed->return_slot && first && first - p->id <= UINT16_MAX &&
                    std::all_of(exits.begin(), exits.end(), [&](std::uint32_t e) { return selected.count(e); });
        // Each exit hook finds the call's return slot from its own CFI, to
        // tell a call the entry hooked from one it did not.
        std::map<std::uint32_t, iprobe_rt_exit_recipe> checked;
        for (std::size_t i = 0; hook && i < exits.size(); i++) {
            const auto slot = elf::return_slot_at(elf::Site{s.list.probes[exits[i]].site, module.get()}, dwarf.get());
            iprobe_rt_exit_recipe r{};
            if (slot) r.return_slot = location_of(*slot);
            r.hooked_exit = static_cast<std::int32_t>(first) - static_cast<std::int32_t>(exits[i]);
            hook = slot.has_value();
            checked[exits[i]] = r;
        }
        if (hook) {
            spec.flags |= IPROBE_RT_VALUES_HOOK;
            spec.distance = static_cast<std::uint16_t>(first - p->id);
            for (std::uint32_t e : exits) plan.silent_exits.insert(e);
            plan.exit_recipes.insert(checked.begin(), checked.end());
            plan.hooked_exit[p->id] = first;
            // the exit probe finds its entry (and its --when) as many back
            iprobe_rt_values_spec exit_spec{};
            exit_spec.flags = options.retval ? IPROBE_RT_VALUES_RETVAL : 0;
            exit_spec.distance = spec.distance;
            plan.specs[first] = exit_spec;
        }
        // An inlined copy's exit hooks, all on, pop the frame its entry pushes (timed as without values).
        std::uint32_t copy_exit = 0;
        for (std::uint32_t e : copy_exits)
            if (e > p->id && (!copy_exit || e < copy_exit)) copy_exit = e;
        if (copy_exit && copy_exit - p->id <= UINT16_MAX &&
            std::all_of(copy_exits.begin(), copy_exits.end(), [&](std::uint32_t e) { return selected.count(e); })) {
            spec.distance = static_cast<std::uint16_t>(copy_exit - p->id);
            // With a --when its exits are recorded as its entry was (the
            // entry keeps its verdict in the call's frame).
            if (conditioned &&
                std::all_of(copy_exits.begin(), copy_exits.end(), [&](std::uint32_t e) { return e > p->id && e - p->id <= UINT16_MAX; }))
                for (std::uint32_t e : copy_exits) {
                    iprobe_rt_values_spec exit_spec{};
                    exit_spec.distance = static_cast<std::uint16_t>(e - p->id);
                    plan.specs[e] = exit_spec;
                    plan.deciding_exits.insert(e);
                }
        }
        if (options.args) {
            spec.flags |= IPROBE_RT_VALUES_ARGS;
            spec.gprs = typed->gprs;
            spec.xmms = typed->xmms;
            spec.strings = typed->strings;
            for (const auto& v : typed->params)
                if (!v.parts.empty() && v.at_site.empty()) plan.optimized_out++;
        }
        if (options.backtrace) {
            spec.flags |= IPROBE_RT_VALUES_BACKTRACE;
            spec.backtrace = static_cast<std::uint8_t>(std::min<unsigned>(options.backtrace, IPROBE_RT_BACKTRACE_MAX));
        }
        plan.specs[p->id] = spec;
        plan.recipes[p->id] = site_recipe(*typed);
    }
    for (const probelist::Probe* p : s.selected) {
        if (at_site_entry(*p)) continue;
        const bool is_exit = p->form == probelist::SiteForm::ret;
        const bool is_entry = !is_exit && probelist::serves_returns(s.list.probes, p->id);
        if (plan.silent_exits.count(p->id)) continue;  // its spec set with its entry's
        if (!options.any()) continue;
        if (plan.inlined_exits.count(p->id)) {  // an inlined copy's: no return, so no value
            if (options.retval) plan.no_return++;
            continue;
        }
        if (!is_exit && !is_entry) {
            if (p->kind != probelist::ProbeKind::point) plan.unavailable++;
            continue;
        }
        iprobe_rt_values_spec spec{};
        if (is_exit) {
            if (!options.retval) continue;
            spec.flags = IPROBE_RT_VALUES_RETVAL;
            plan.specs[p->id] = spec;
            continue;
        }
        if (!options.args && !options.backtrace) continue;
        if (options.args) {
            load();
            std::optional<elf::FunctionValues> typed;
            if (dwarf && p->function_address) typed = elf::function_values(*dwarf, p->function_address, p->function);
            if (!typed) plan.untyped++;
            const elf::FunctionValues values = typed ? *typed : elf::raw_function_values();
            spec.flags |= IPROBE_RT_VALUES_ARGS;
            spec.gprs = values.gprs;
            spec.xmms = values.xmms;
            spec.strings = values.strings;
        }
        if (options.backtrace) {
            spec.flags |= IPROBE_RT_VALUES_BACKTRACE;
            spec.backtrace = static_cast<std::uint8_t>(std::min<unsigned>(options.backtrace, IPROBE_RT_BACKTRACE_MAX));
        }
        plan.specs[p->id] = spec;
    }
    return plan;
}

}  // namespace iprobe::hotpatch
