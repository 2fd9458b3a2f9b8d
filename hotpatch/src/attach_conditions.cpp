#include "attach_conditions.h"

#include <cstring>
#include <optional>
#include <set>

#include "iprobe/elf/function_values.h"
#include "stubs.h"
#include "values_plan.h"

namespace iprobe::hotpatch {

namespace {

ConditionSignature signature_of(const std::optional<elf::FunctionValues>& f) {
    ConditionSignature s;
    if (!f || !f->typed) return s;
    s.has_dwarf = true;
    auto integer = [](const elf::ValueType& t) {
        using C = elf::ValueClass;
        return t.cls == C::signed_int || t.cls == C::unsigned_int || t.cls == C::boolean || t.cls == C::enumeration ||
               t.cls == C::pointer || t.cls == C::string;
    };
    auto condition_value = [&](const elf::ValueSlot& v) {
        ConditionParameter c{v.name, v.type.name, -1, v.type.size ? v.type.size : 8,
                             v.type.cls == elf::ValueClass::signed_int || v.type.cls == elf::ValueClass::enumeration,
                             v.type.cls == elf::ValueClass::string};
        // One integer register holds it whole (a clone's constant or a value in memory: none).
        if (integer(v.type) && v.parts.size() == 1 && !v.parts[0].vector && v.type.size <= 8)
            c.register_index = v.parts[0].reg;
        return c;
    };
    for (const auto& p : f->params) {
        if (p.name.empty()) continue;
        ConditionParameter c = condition_value(p);
        // At a -finstrument-functions site the recipe stands for the register: none, none.
        if (f->at_site && !p.parts.empty() && p.at_site.empty()) c.register_index = -1, c.optimized_out = true;
        s.parameters.push_back(std::move(c));
    }
    s.returns_value = f->ret.has_value();
    if (f->ret) {
        s.retval = condition_value(*f->ret);
        s.retval.name = "retval";
        if (s.retval.register_index < 0) s.retval = {"retval", f->ret->type.name, -1, 8, true, false};
    }
    return s;
}

std::string has_list(const ConditionSignature& s) {
    if (!s.has_dwarf) return "no DWARF (build with -g): only arg0..arg5, retval, duration";
    std::string out;
    for (const auto& p : s.parameters) out += (out.empty() ? "" : ", ") + p.name;
    return out.empty() ? "no parameters" : "has " + out;
}

// A parameter `condition` names that is optimized out in `s`.
std::optional<std::string> optimized_out_name(const Condition& condition, const ConditionSignature& s) {
    for (const auto& name : condition.parameter_names())
        for (const auto& p : s.parameters)
            if (p.name == name && p.optimized_out) return name;
    return std::nullopt;
}

std::uint8_t retval_spec(const ConditionSignature& s) {
    if (!s.returns_value || !s.has_dwarf) return s.returns_value ? 8 | IPROBE_RT_RETVAL_SIGNED : 0;
    if (s.retval.register_index < 0) return 0;  // not an integer
    return static_cast<std::uint8_t>(s.retval.size | (s.retval.is_signed ? IPROBE_RT_RETVAL_SIGNED : 0));
}

}  // namespace

Condition attach_condition(const AttachOptions& options) {
    Condition when = options.when.empty() ? Condition() : Condition::parse(options.when);
    Condition longer = options.min_duration.empty() ? Condition() : Condition::min_duration(options.min_duration);
    return Condition::both(std::move(when), std::move(longer));
}

ConditionPlan plan_conditions(const Condition& condition, const AttachOptions& options,
                              const std::vector<SelectedList>& lists) {
    ConditionPlan plan(lists.size());
    const bool wanted = !condition.empty() || options.retval_histogram;
    std::vector<std::string> lacking;
    std::size_t lacking_count = 0;
    // Inlined copies whose hook has a named parameter optimized out: left
    // undecidable when another entry can decide (else refused as any).
    std::size_t decidable = 0;
    std::optional<ConditionSignature> undecided_example;
    std::vector<FunctionCondition*> undecidable;
    for (std::size_t li = 0; li < lists.size(); li++) {
        const SelectedList& s = lists[li];
        std::shared_ptr<elf::ElfFile> dwarf, module;
        bool dwarf_tried = false;
        std::set<std::uint32_t> exits_on;
        std::set<std::uint64_t> functions_exiting;  // with a selected exit probe, by address
        for (const probelist::Probe* p : s.selected) {
            if (p->form == probelist::SiteForm::ret) exits_on.insert(p->id - 1);
            if (p->kind == probelist::ProbeKind::exit) functions_exiting.insert(p->function_address);
        }
        for (const probelist::Probe* p : s.selected) {
            if (p->kind != probelist::ProbeKind::entry) continue;
            const bool entry_site = probelist::serves_returns(s.list.probes, p->id);
            const bool at_site = at_site_entry(*p);  // -finstrument-functions: through the site's recipe
            if (!entry_site && !at_site) {
                if (condition.empty()) continue;
                throw Error("--when and --min-duration need function entries; " + p->demangled +
                                " is probed through a NOP-form point",
                            ExitCode::usage);
            }
            if (at_site && functions_exiting.count(p->function_address))  // its exit hooks, wherever they are in the list
                exits_on.insert(p->id);
            auto& planned = plan[li][p->id];
            if (!wanted) continue;  // selected: its condition is cleared
            if (condition.at_exit() && !exits_on.count(p->id))
                throw Error("--when '" + condition.text() + "' reads retval or duration, which " + p->demangled +
                                "'s exit probe gives: drop --entry-only",
                            ExitCode::usage);
            if (!dwarf_tried) dwarf = dwarf_of(options.pid, s), module = module_of(options.pid, s), dwarf_tried = true;
            std::optional<elf::FunctionValues> values;
            if (dwarf) values = values_for(*dwarf, module.get(), *p);
            if (at_site && !values && !condition.empty())
                throw Error(!dwarf ? "--when on " + p->demangled +
                                         " needs its DWARF (build with -g): at a -finstrument-functions site, after "
                                         "the prologue, arg0..arg5 are not in their registers"
                                   : "--when on " + p->demangled + ": its hook at " + hex_address(p->site) +
                                         " is outside its code, and the DWARF has no inlined copy of it there "
                                         "(DW_TAG_inlined_subroutine) to read its parameters from",
                            ExitCode::bad_input);
            const bool inlined = values && values->inlined;
            if (inlined && condition.at_exit())
                throw Error("--when '" + condition.text() + "' reads retval or duration, which " + p->demangled +
                                "'s inlined copy at " + hex_address(p->site) +
                                " does not have: it is inlined into another function's code and does not return "
                                "(no return value, no return to time); use a condition on its arguments, or "
                                "select only functions that are not inlined",
                            ExitCode::bad_input);
            const ConditionSignature signature = signature_of(values);
            // an inlined copy has no return value to keep a histogram of
            if (options.retval_histogram && !inlined) planned.retval_hist = retval_spec(signature);
            if (condition.empty()) continue;
            if (const auto missing = unknown_name(condition, signature)) {
                if (lacking_count++ < 8)
                    lacking.push_back(p->demangled + " lacks '" + *missing + "' (" + has_list(signature) + ")");
                continue;
            }
            if (inlined && optimized_out_name(condition, signature)) {
                undecidable.push_back(&planned);
                if (!undecided_example) undecided_example = signature;
                continue;
            }
            planned.program = condition.compile(signature);  // type errors: ConditionError, exit 3
            decidable++;
        }
    }
    if (!undecidable.empty() && !decidable) condition.compile(*undecided_example);  // throws: optimized out
    if (!undecidable.empty()) {
        const iprobe_cond_program never = Condition::parse("0 == 1").compile(ConditionSignature{});
        for (FunctionCondition* f : undecidable) f->program = never, f->undecidable = true;
    }
    if (!lacking.empty()) {
        std::string message = "--when '" + condition.text() + "' names what " + std::to_string(lacking_count) +
                              " selected function" + (lacking_count > 1 ? "s do" : " does") + " not have:";
        for (const auto& l : lacking) message += "\n  " + l;
        if (lacking_count > lacking.size()) message += "\n  ... and " + std::to_string(lacking_count - lacking.size()) + " more";
        throw Error(message + "\nselect only functions that have it (--functions), or use arg0..arg5", ExitCode::bad_input);
    }
    return plan;
}

std::vector<ConditionStore> condition_stores(const ConditionPlan& plan, const std::vector<std::uint32_t>& first_probes) {
    std::vector<ConditionStore> stores;
    for (std::size_t li = 0; li < plan.size() && li < first_probes.size(); li++)
        for (const auto& [id, fc] : plan[li])
            stores.push_back({first_probes[li] + id, fc.program.op_count ? &fc.program : nullptr, fc.retval_hist});
    return stores;
}

void apply_conditions(Region& region, const std::vector<ConditionStore>& stores) {
    iprobe_rt_control* cb = region.control();
    iprobe_rt_probe* probes = region.probes();
    const iprobe_cond_program* last = nullptr;  // the same --when compiles alike for most functions
    std::uint16_t last_index = 0;
    for (const ConditionStore& c : stores) {
        const std::uint32_t global = c.global;
        if (global + 1 >= region.probe_count()) continue;
        std::uint16_t index = 0;
        if (c.program && last && std::memcmp(c.program, last, sizeof *last) == 0) {
            index = last_index;
        } else if (c.program) {
            iprobe_cond_program program = *c.program;
            convert_durations(program, cb->tsc_hz);
            const std::uint32_t count = region.condition_count();
            iprobe_cond_program* table = region.conditions();
            std::uint32_t at = 0;
            while (at < count && std::memcmp(&table[at], &program, sizeof program) != 0) at++;
            if (at == count) {
                if (count >= region.condition_capacity())
                    throw Error("the region holds " + std::to_string(count) +
                                    " conditions already (every --when of this process's life): restart the "
                                    "target to attach more",
                                ExitCode::unavailable);
                table[at] = program;
                __atomic_store_n(&cb->condition_count, count + 1, __ATOMIC_RELEASE);
            }
            index = static_cast<std::uint16_t>(at + 1);
            last = c.program, last_index = index;
        }
        __atomic_store_n(&probes[global].condition, index, __ATOMIC_RELEASE);
        __atomic_store_n(&probes[global + 1].retval_hist, c.retval_hist, __ATOMIC_RELEASE);
    }
}

}  // namespace iprobe::hotpatch
