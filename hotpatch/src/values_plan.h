// What each selected probe captures (`attach --args --retval --backtrace`):
// the per-probe spec the runtime reads (rt_layout.h, iprobe_rt_values_spec),
// from the function's DWARF, worked out before the target stops.
#pragma once

#include <map>
#include <memory>
#include <set>

#include "attach_plan.h"
#include "iprobe/elf/function_values.h"
#include "iprobe/formats/rt_layout.h"
#include "iprobe/hotpatch/hotpatch.h"

namespace iprobe::hotpatch {

struct ValuesPlan {
    std::map<std::uint32_t, iprobe_rt_values_spec> specs;  // probe id in the list -> spec
    // -finstrument-functions flow: an entry's recipe (its stub slot holds
    // it; its stub goes to the values entry point), and the exit probes
    // whose exits the entry's hooked return records (their stubs go to a
    // checked exit, which records only the calls the entry did not hook).
    std::map<std::uint32_t, iprobe_rt_site_recipe> recipes;
    std::set<std::uint32_t> silent_exits;
    // ... each checked at run time (rt_layout.h, iprobe_rt_exit_recipe): its
    // exit is recorded there unless the call's return slot holds the hook.
    std::map<std::uint32_t, iprobe_rt_exit_recipe> exit_recipes;
    // An inlined copy's exit hooks when its entry has a --when: their stubs
    // go to the runtime's iprobe_rt_copy_exit_id, which records the exit as
    // the entry was (its verdict kept in the call's frame).
    std::set<std::uint32_t> deciding_exits;
    std::map<std::uint32_t, std::uint32_t> hooked_exit;  // entry id -> the exit probe its hooked return records
    std::size_t unavailable = 0;   // selected, records no values (a point; a finstrument site without DWARF)
    std::size_t untyped = 0;       // entry probes without DWARF
    std::size_t optimized_out = 0; // finstrument flow: parameters the site's recipe cannot find
    // finstrument flow: the exit hooks of inlined copies (in another
    // function's code), and those of them asked for a return value they
    // cannot have (an inlined copy does not return).
    std::set<std::uint32_t> inlined_exits;
    std::size_t no_return = 0;
};

// The DWARF of the module `s` lists, as the target sees its files (a
// clone's mount namespace): the mapped file itself, or its separate debug
// file; null when there is none.
std::shared_ptr<elf::ElfFile> dwarf_of(pid_t pid, const SelectedList& s);

// `conditioned`: a --when is set, which a -finstrument-functions entry
// evaluates through the values path (its arguments come from the recipe).
ValuesPlan plan_values(pid_t pid, const SelectedList& s, const ValueOptions& options, bool conditioned);

// A -finstrument-functions entry (a call after the prologue): its values
// are had through a recipe of the site.
bool at_site_entry(const probelist::Probe& p);

// The function's values typed for `p`: at its site when at_site_entry(p).
std::optional<elf::FunctionValues> values_for(const elf::ElfFile& dwarf, const elf::ElfFile* module,
                                              const probelist::Probe& p);

// The module itself (its .eh_frame), as the target sees it; null when absent.
std::shared_ptr<elf::ElfFile> module_of(pid_t pid, const SelectedList& s);

// The recipe's bytes for the site's stub slot.
iprobe_rt_site_recipe site_recipe(const elf::FunctionValues& values);

// The spec as the one 8-byte word the runtime loads.
std::uint64_t spec_word(const iprobe_rt_values_spec& spec);

}  // namespace iprobe::hotpatch
