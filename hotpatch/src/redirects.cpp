#include "redirects.h"

#include <algorithm>
#include <climits>
#include <cstring>

#include "patch.h"
#include "session.h"

namespace iprobe::hotpatch {

std::array<std::uint8_t, kPatchStubSize> patch_stub_bytes(std::uint64_t target) {
    std::array<std::uint8_t, kPatchStubSize> b{0xff, 0x25, 0x00, 0x00, 0x00, 0x00};  // jmp *0(%rip)
    std::memcpy(b.data() + 6, &target, 8);
    b[14] = b[15] = 0xcc;
    return b;
}

namespace {

bool is_patch_stub(const std::uint8_t* slot, std::uint64_t* target) {
    static constexpr std::uint8_t kJump[6] = {0xff, 0x25, 0x00, 0x00, 0x00, 0x00};
    if (std::memcmp(slot, kJump, sizeof kJump) != 0 || slot[14] != 0xcc || slot[15] != 0xcc) return false;
    std::memcpy(target, slot + 6, 8);
    return true;
}

bool reaches_all_of(std::uint64_t at, std::uint64_t size, const RunningModule& running) {
    const std::uint64_t low = std::min(at, running.low), high = std::max(at + size, running.high);
    return high - low < static_cast<std::uint64_t>(kReach);
}

}  // namespace

bool within_rel32(std::uint64_t from_end, std::uint64_t to) {
    const std::int64_t rel = static_cast<std::int64_t>(to) - static_cast<std::int64_t>(from_end);
    return rel >= INT32_MIN && rel <= INT32_MAX;
}

std::optional<Redirect> redirect_at(const ProcessMemory& memory, std::uint64_t site, const std::uint8_t* bytes,
                                    std::uint8_t size, StubChecker& stubs) {
    if (size != 5 || bytes[0] != 0xe9 || stubs.calls_a_stub(site, bytes, size)) return std::nullopt;
    Redirect r{0, called_stub(site, bytes, size)};
    try {
        std::uint8_t head[kPatchPageMagic.size()], slot[kPatchStubSize];
        memory.read(r.target & ~(kPage - 1), head, sizeof head);
        if (std::equal(kPatchPageMagic.begin(), kPatchPageMagic.end(), head) && r.target % kPatchStubSize == 0) {
            memory.read(r.target, slot, sizeof slot);
            std::uint64_t target = 0;
            if (is_patch_stub(slot, &target)) r = {r.target, target};
        }
    } catch (const Error&) {
        // An unmapped destination: a jump to nowhere, reported as it is.
    }
    return r;
}

std::uint64_t patch_stub_for(StoppedProcess& process, const LoadedLibrary& libc, const RunningModule& running,
                             std::uint64_t target) {
    const auto wanted = patch_stub_bytes(target);
    std::array<std::uint8_t, kPage> page;
    for (const Mapping& m : read_maps(process.pid())) {
        if (!m.path.empty() || !m.executable() || m.end - m.start < kPage || !reaches_all_of(m.start, kPage, running))
            continue;
        try {
            process.read(m.start, page.data(), page.size());
        } catch (const Error&) {
            continue;
        }
        if (!std::equal(kPatchPageMagic.begin(), kPatchPageMagic.end(), page.begin())) continue;
        std::uint64_t free_slot = 0;
        for (std::size_t at = kPatchStubSize; at + kPatchStubSize <= kPage; at += kPatchStubSize) {
            if (std::equal(wanted.begin(), wanted.end(), page.begin() + static_cast<long>(at))) return m.start + at;
            if (!free_slot && std::all_of(page.begin() + static_cast<long>(at),
                                          page.begin() + static_cast<long>(at + kPatchStubSize),
                                          [](std::uint8_t b) { return b == 0; }))
                free_slot = m.start + at;
        }
        if (free_slot) {
            process.write(free_slot, wanted.data(), wanted.size());
            return free_slot;
        }
    }
    const std::uint64_t fresh = map_stubs_near(process, libc, running, kPage);
    process.write(fresh, kPatchPageMagic.data(), kPatchPageMagic.size());
    process.write(fresh + kPatchStubSize, wanted.data(), wanted.size());
    return fresh + kPatchStubSize;
}

}  // namespace iprobe::hotpatch

namespace iprobe::hotpatch {

std::vector<std::string> drop_redirected(const ProcessMemory& memory, const probelist::ProbeList& list,
                                         const RunningModule& running, std::vector<const probelist::Probe*>& selected) {
    const std::uint64_t load_bias = running.load_bias;
    auto entry_of = [&](const probelist::Probe* p) -> const probelist::Probe* {
        const std::uint32_t id = p->form == probelist::SiteForm::ret && p->id > 0 ? p->id - 1 : p->id;
        if (id >= list.probes.size()) return nullptr;
        const probelist::Probe& e = list.probes[id];
        return e.kind == probelist::ProbeKind::entry && e.form == probelist::SiteForm::nop && e.size == 5 &&
                       probelist::serves_returns(list.probes, id) && running.holds_code(e.site, e.size)
                   ? &e
                   : nullptr;
    };
    std::vector<std::uint64_t> addresses;
    for (const probelist::Probe* p : selected)
        if (const probelist::Probe* e = entry_of(p)) addresses.push_back(load_bias + e->site);
    if (addresses.empty()) return {};
    const std::vector<SiteText> text = read_sites(memory, addresses);
    StubChecker stubs(memory);
    std::vector<std::string> dropped;
    std::vector<const probelist::Probe*> kept;
    std::size_t k = 0;
    for (const probelist::Probe* p : selected) {
        const probelist::Probe* e = entry_of(p);
        if (e && std::memcmp(text[k].data(), e->placeholder.data(), 5) != 0 &&
            redirect_at(memory, addresses[k], text[k].data(), 5, stubs)) {
            if (dropped.empty() || dropped.back() != e->demangled) dropped.push_back(e->demangled);
        } else {
            kept.push_back(p);
        }
        if (e) k++;
    }
    selected = std::move(kept);
    return dropped;
}

}  // namespace iprobe::hotpatch
