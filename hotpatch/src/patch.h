// Writing sites: where the jump stubs go, which handler a site calls, and the
// batched write with read-back and rollback.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "iprobe/hotpatch/hotpatch.h"
#include "iprobe/runtime/rt.h"
#include "inject.h"
#include "modules.h"
#include "process.h"
#include "stubs.h"

namespace iprobe::hotpatch {

inline constexpr std::int64_t kReach = (1ll << 31) - 2 * static_cast<std::int64_t>(kPage);

// A free, page-aligned address from which every byte of [low, high) is
// within a rel32 call.  Prefers the gap just below the module; never the
// room right after [heap], which brk grows into.
std::optional<std::uint64_t> stub_address(const std::vector<Mapping>& maps, std::uint64_t low, std::uint64_t high,
                                          std::uint64_t size = kPage);

struct Patch {
    std::uint64_t address = 0;
    SiteBytes before, after;
};

void sort_by_address(std::vector<Patch>& patches);

// Writes all patches (sorted by address) page-run by page-run through
// /proc/PID/mem, reads them back; on any failure puts back what was written
// and rethrows.
void apply_patches(StoppedProcess& process, const std::vector<Patch>& patches);

// A site's own stub (stubs.h, site_stub_bytes / count_stub_bytes) in the
// stub area of its module.
struct SiteStub {
    std::uint64_t area = 0;  // the module's site-stub area
    std::uint64_t address = 0;
    std::array<std::uint8_t, kSiteStubSize> bytes{};
};

// Writes the stubs that differ from what their slots hold, one read and one
// write per module's area rather than per stub: 10k stubs would otherwise be
// 20k syscalls while the world is stopped.  A slot is rewritten only while its
// site is a NOP, but a thread may still be inside it from before a detach:
// throws RetryLater until none is.
void write_site_stubs(StoppedProcess& process, std::vector<SiteStub>& stubs);
// Drops the stubs whose slots already hold them (read while the target
// runs: only iprobe writes stubs, under the session lock), so the stop
// reads and writes only the others.
void drop_written_stubs(const ProcessMemory& memory, std::vector<SiteStub>& stubs);
// Writes, while the target runs, the stubs in `unused_areas` (site-stub
// areas this attach mapped, which no site has called: no thread can be in
// them) and drops them from `stubs`, leaving the others to the stop.
void write_stubs_ahead(ProcessMemory& memory, std::vector<SiteStub>& stubs, const std::set<std::uint64_t>& unused_areas);

// No thread may be stopped strictly inside a range about to change
// (`patches` sorted by address).
std::string unsafe_pcs(const StoppedProcess& process, const std::vector<Patch>& patches);

const std::string& handler_symbol(const HandlerSymbols& h, const probelist::Probe& p);

// Where a count stub's counter lies in a thread's sums (SiteId::counter);
// past every slot for a probe without one, which the handler ignores.
std::uint32_t counter_offset(std::uint32_t stat, probelist::ProbeKind kind);

// The per-site entry point for `p`, or empty where its site takes the shared stub.
const std::string& id_symbol(const HandlerSymbols& h, const probelist::Probe& p);

// The stub in the module's stub page that jumps to `target`, if it has one
// (read while the target runs: only attach writes the page, under the session lock).
std::optional<std::uint64_t> find_stub(const ProcessMemory& memory, const iprobe_rt_module& module,
                                       std::uint64_t target);

// The stub in the module's stub page that jumps to `target`, created if needed.
std::uint64_t stub_for(StoppedProcess& process, iprobe_rt_module& module, std::uint64_t target);

// Maps `size` bytes of stubs, read-only and executable, where every byte of
// the module is within a rel32 call of every byte of them.
std::uint64_t map_stubs_near(StoppedProcess& process, const LoadedLibrary& libc, const RunningModule& running,
                             std::uint64_t size);

void ensure_stub_page(StoppedProcess& process, const LoadedLibrary& libc, const RunningModule& running,
                      iprobe_rt_module& module);

// One site-stub slot per probe id of the module (or `slots`, at least as
// many: relocated_entries.h), mapped on first use.
// The module has its per-site stub area, for `slots` probe ids at least.
bool has_site_stubs(const iprobe_rt_module& module, std::uint32_t slots);
void ensure_site_stubs(StoppedProcess& process, const LoadedLibrary& libc, const RunningModule& running,
                       iprobe_rt_module& module, std::uint32_t slots = 0);

}  // namespace iprobe::hotpatch
