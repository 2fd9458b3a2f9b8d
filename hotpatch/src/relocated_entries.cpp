#include "relocated_entries.h"

#include <algorithm>

#include "iprobe/relocate/entry_relocation.h"
#include "iprobe/support/error.h"

namespace iprobe::hotpatch {

static_assert(relocate::kMaxTrampoline <= kSiteStubSize, "a trampoline fits a site-stub slot");

std::uint32_t site_stub_slots_for(const probelist::ProbeList& list) {
    const auto probes = static_cast<std::uint32_t>(list.probes.size());
    return list.flow == IPROBE_FLOW_UNPREPARED || list.has_relocated() ? 2 * probes : probes;
}

SiteStub relocated_trampoline(const iprobe_rt_module& module, const probelist::Probe& entry, std::uint64_t site) {
    if (entry.moved.empty())
        throw Error(entry.demangled + " has no pad and its list was read without the binary, whose first " +
                        "instructions its trampoline needs: name the binary (or its module), not its probe list",
                    ExitCode::bad_input);
    if (module.site_stub_slots < module.probe_count + entry.id + 1)
        throw Error("the site-stub area of " + std::string(module.path) + " has no room for the trampoline of " +
                        entry.demangled,
                    ExitCode::bad_input);
    SiteStub stub;
    stub.area = module.site_stubs;
    stub.address = module.site_stubs + (std::uint64_t{module.probe_count} + entry.id) * kSiteStubSize;
    stub.bytes.fill(0xcc);
    const std::vector<std::uint8_t> code = relocate::trampoline(entry.moved, site, stub.address);
    std::copy(code.begin(), code.end(), stub.bytes.begin());
    return stub;
}

void require_same_trampoline(const ProcessMemory& memory, const probelist::Probe& entry, const SiteStub& trampoline) {
    std::array<std::uint8_t, kSiteStubSize> held{};
    memory.read(trampoline.address, held.data(), held.size());
    if (held != trampoline.bytes)
        throw Error("the trampoline of " + entry.demangled + " at " + hex_address(trampoline.address) +
                        " is not the one its entry was relocated to; detach it first (iprobe detach PID --functions '" +
                        entry.demangled + "')",
                    ExitCode::busy);
}

}  // namespace iprobe::hotpatch
