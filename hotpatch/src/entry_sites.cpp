#include "entry_sites.h"

#include <cstring>

#include "session.h"

namespace iprobe::hotpatch {

namespace {
constexpr std::uint64_t kBothOffset = kSiteStubSize / 2;
}  // namespace

std::uint64_t variant_stub(std::uint64_t area, std::uint32_t entry, EntryVariant v) {
    if (!v.exit) return area + std::uint64_t{entry} * kSiteStubSize;
    return area + std::uint64_t{entry + 1} * kSiteStubSize + (v.enter ? kBothOffset : 0);
}

std::optional<EntryVariant> variant_at(std::uint64_t target, std::uint32_t entry) {
    for (EntryVariant v : {EntryVariant{true, false}, EntryVariant{false, true}, EntryVariant{true, true}}) {
        const std::uint64_t offset = variant_stub(0, entry, v);
        if (target >= offset && (target - offset) % kPage == 0) return v;
    }
    return std::nullopt;
}

const std::string& variant_symbol(const HandlerSymbols& handlers, EntryVariant v) {
    if (v.enter && v.exit) return handlers.entry_enter_return;
    if (v.exit) return handlers.entry_return;
    return handlers.entry_enter;
}

EntrySiteStubs entry_site_stubs(std::uint32_t id, const EntryTargets& targets, std::int32_t inline_count_tpoff,
                                std::uint64_t area, std::uint32_t entry, std::uint64_t site_end) {
    EntrySiteStubs out;
    out.entry_slot.fill(0xcc);
    out.exit_slot.fill(0xcc);
    const std::uint64_t entry_at = variant_stub(area, entry, {true, false});
    if (targets.enter)
        out.entry_slot = inline_count_tpoff
                             ? entry_count_stub_bytes(inline_count_tpoff, id, entry_at, site_end, targets.enter)
                             : entry_stub_bytes(id, site_end, targets.enter);
    auto put_half = [&](std::uint64_t target, EntryVariant v) {
        if (!target) return;
        const std::uint64_t at = variant_stub(area, entry, v);
        const auto stub = entry_stub_bytes(id, site_end, target);
        std::memcpy(out.exit_slot.data() + (at - variant_stub(area, entry, {false, true})), stub.data(), kBothOffset);
    };
    put_half(targets.exit, {false, true});
    put_half(targets.both, {true, true});
    return out;
}

}  // namespace iprobe::hotpatch
