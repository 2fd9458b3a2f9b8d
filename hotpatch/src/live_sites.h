// The probe sites of a process as its code holds them, found without
// trusting its region, which the target can write: modules from the
// kernel's maps, build-id and load bias from the target's own ELF headers,
// each module's probe list found beside the mapped file first (the region's
// recorded path only as module_probe_list() allows it) and accepted only if
// it describes that very build, and every site's state read from the code.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <vector>

#include "iprobe/probelist/probe_list.h"
#include "modules.h"
#include "process.h"
#include "region.h"
#include "stubs.h"

namespace iprobe::hotpatch {

inline constexpr std::uint32_t kNotInRegion = UINT32_MAX;

struct AttachedModule {
    std::uint32_t region_index = kNotInRegion;  // in the region's module table
    RunningModule running;
    probelist::ProbeList list;
    // Per list probe: its address in the target, 0 where the list's offset
    // is not inside the module's executable segments (never read or written).
    std::vector<std::uint64_t> sites;
};

// The region's modules that are still mapped, each with its probe list.
// Throws Error(not_found) when a mapped module's list cannot be found.
std::vector<AttachedModule> attached_modules(pid_t pid, const Region& region, const ProcessMemory& memory);

// What detach restores, needing nothing from the region: every mapped
// module whose probe list lies beside it (and describes its build), plus the
// region's other modules when there is a sound region (`region` may be
// null: unreadable, or rewritten by the target).
// In a child forked from a probed process (no region of its own),
// `inherited` is the parent's module table the runtime kept
// (inherited_modules(), region.h), found the same way.
std::vector<AttachedModule> probed_modules(pid_t pid, const Region* region, const ProcessMemory& memory,
                                           const std::vector<iprobe_rt_module>& inherited = {});

enum class SiteState : std::uint8_t {
    absent,       // no address (outside the module's code)
    placeholder,  // the NOP the list records: off
    live,         // a call into one of our stubs: on
    other,        // anything else (someone else's patch, or a changed binary): left alone
};

SiteState site_state(const probelist::Probe& probe, std::uint64_t address, const SiteText& text, StubChecker& stubs);

// The state of every site of `module`, per list probe.
std::vector<SiteState> site_states(const AttachedModule& module, const ProcessMemory& memory, StubChecker& stubs);

}  // namespace iprobe::hotpatch
