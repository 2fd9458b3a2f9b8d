#include "values_plan.h"

#include <cstring>
#include <memory>

#include "iprobe/elf/function_values.h"
#include "iprobe/support/error.h"
#include "iprobe/support/proc.h"
#include "inject.h"
#include "modules.h"
#include "process.h"

namespace iprobe::hotpatch {

std::shared_ptr<elf::ElfFile> dwarf_of(pid_t pid, const SelectedList& s) {
    std::shared_ptr<elf::ElfFile> module;
    for (const auto& m : read_maps(pid))
        if (!m.path.empty() && (m.path == s.list.module || basename_of(m.path) == basename_of(s.list.module))) try {
                module = elf_cache().get(pid, m.path);
                break;
            } catch (const Error&) {
            }
    if (!module) return nullptr;
    const auto path = elf::debug_file_for(*module);
    if (!path) return nullptr;
    if (*path == module->path()) return module;
    try {
        return reading_target(pid, [&] { return std::make_shared<elf::ElfFile>(target_view(pid, *path)); });
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

ValuesPlan plan_values(pid_t pid, const SelectedList& s, const ValueOptions& options) {
    ValuesPlan plan;
    if (!options.any()) return plan;
    std::shared_ptr<elf::ElfFile> dwarf;
    bool dwarf_tried = false;
    for (const probelist::Probe* p : s.selected) {
        const bool is_exit = p->form == probelist::SiteForm::ret;
        const bool is_entry = !is_exit && probelist::serves_returns(s.list.probes, p->id);
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
            if (!dwarf_tried) dwarf = dwarf_of(pid, s), dwarf_tried = true;
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
