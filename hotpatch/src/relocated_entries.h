// Function entries without a pad: of binaries nobody prepared (flow
// IPROBE_FLOW_UNPREPARED) and the entry flow's unpadded functions (small
// functions; probelist/symbol_probes.h): the site is the function's first instruction
// (after an endbr64), served exactly as a pad is (entry_sites.h: a jmp to
// one of three stubs of the site's own, exits through return trampolines),
// except that its handler goes on through a trampoline holding the
// instructions the jmp replaces, moved (relocate/entry_relocation.h), and a
// jump back to the first one left in place.
//
// The trampolines live in the module's site-stub area after the probes' own
// slots: entry `id`'s at slot probe_count + id, so the area of a module
// with such entries has twice as many slots.  They are written before the site and stay after
// a detach (a thread may still be inside one); detach writes the file's own
// first bytes back.
#pragma once

#include <cstdint>

#include "iprobe/probelist/probe_list.h"
#include "patch.h"
#include "process.h"
#include "iprobe/runtime/rt.h"

namespace iprobe::hotpatch {

// Slots the module's site-stub area needs for `list`.
std::uint32_t site_stub_slots_for(const probelist::ProbeList& list);

// The trampoline of the relocated entry `entry` (its `moved` bytes), for
// the site at `site` in the target.  Throws Error(bad_input) when the area
// was mapped without the trampoline slots or the list was read without the
// binary (no moved bytes), Error when a target of the moved
// code is out of reach.
SiteStub relocated_trampoline(const iprobe_rt_module& module, const probelist::Probe& entry, std::uint64_t site);

// A live relocated entry goes on through the trampoline it was enabled
// with, which must be the one this attach would write: throws Error(busy)
// otherwise (the slot is never rewritten under a live site).
void require_same_trampoline(const ProcessMemory& memory, const probelist::Probe& entry, const SiteStub& trampoline);

}  // namespace iprobe::hotpatch
