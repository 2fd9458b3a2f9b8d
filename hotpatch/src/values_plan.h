// What each selected probe captures (`attach --args --retval --backtrace`):
// the per-probe spec the runtime reads (rt_layout.h, iprobe_rt_values_spec),
// from the function's DWARF, worked out before the target stops.
#pragma once

#include <map>
#include <memory>

#include "attach_plan.h"
#include "iprobe/formats/rt_layout.h"
#include "iprobe/hotpatch/hotpatch.h"

namespace iprobe::elf {
class ElfFile;
}

namespace iprobe::hotpatch {

struct ValuesPlan {
    std::map<std::uint32_t, iprobe_rt_values_spec> specs;  // probe id in the list -> spec
    std::size_t unavailable = 0;                           // selected, not a function-entry site
    std::size_t untyped = 0;                               // entry probes without DWARF
};

// The DWARF of the module `s` lists, as the target sees its files (a
// clone's mount namespace): the mapped file itself, or its separate debug
// file; null when there is none.
std::shared_ptr<elf::ElfFile> dwarf_of(pid_t pid, const SelectedList& s);

ValuesPlan plan_values(pid_t pid, const SelectedList& s, const ValueOptions& options);

// The spec as the one 8-byte word the runtime loads.
std::uint64_t spec_word(const iprobe_rt_values_spec& spec);

}  // namespace iprobe::hotpatch
