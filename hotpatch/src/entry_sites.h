// Function-entry sites that hook returns (the entry and LLVM flows): one
// 5-byte NOP at the very start of a function serves two probes, its entry
// probe and its exit probe of form `ret` (probelist::serves_returns).  An
// enabled site jumps (no call: the return stack buffer must only see the
// function's own calls) to one of three stubs of its own, by which of the
// two are on; the exit is then served by a return trampoline of the runtime
// (runtime/src/return_stack.h).
//
// The stubs of such a site live in the slots of its two probe ids in the
// module's site-stub area: entry only at slot(entry); exit only at
// slot(exit); both at slot(exit) + 32.  So which probes a live site serves is
// read from the code alone: the call's target, less the slot offset of each
// variant, gives a page-aligned area for exactly one of them.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "iprobe/hotpatch/hotpatch.h"
#include "iprobe/probelist/probe_list.h"
#include "stubs.h"

namespace iprobe::hotpatch {

struct EntryVariant {
    bool enter = false, exit = false;
    bool any() const { return enter || exit; }
    bool operator==(const EntryVariant&) const = default;
    EntryVariant operator|(EntryVariant o) const { return {enter || o.enter, exit || o.exit}; }
};

// Where the stub for `v` lies for the site whose entry probe has id `entry`.
std::uint64_t variant_stub(std::uint64_t area, std::uint32_t entry, EntryVariant v);

// Which variant a live site calling `target` serves; nullopt when `target` is
// none of them (a shared stub: an older attach, or another handler's).
std::optional<EntryVariant> variant_at(std::uint64_t target, std::uint32_t entry);

// The symbol of `handlers` serving `v`; empty when it has none.
const std::string& variant_symbol(const HandlerSymbols& handlers, EntryVariant v);

// The two slots of a site for one handler, all three variants written at
// once so that a later attach or detach only moves the site's call:
// slot(entry) = entry only; slot(exit) = exit only, then both at +32.
struct EntrySiteStubs {
    std::array<std::uint8_t, kSiteStubSize> entry_slot{}, exit_slot{};
};

// `id` is what the stubs push (HandlerSymbols::SiteId); a zero
// `inline_count_tpoff` keeps the count handler out of the entry-only stub.
// An unresolved target (0) leaves its variant as int3 (never called).
// `area` is the module's site-stub area, `site_end` where the function goes on.
struct EntryTargets {
    std::uint64_t enter = 0, exit = 0, both = 0;
};
EntrySiteStubs entry_site_stubs(std::uint32_t id, const EntryTargets& targets, std::int32_t inline_count_tpoff,
                                std::uint64_t area, std::uint32_t entry, std::uint64_t site_end);

}  // namespace iprobe::hotpatch
