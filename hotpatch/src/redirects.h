// Function entries redirected to a replacement (`iprobe patch`, live_patch.h):
// how the jump is encoded, the stub pages it may go through, and telling a
// redirect from a probe, read from the code alone.
//
// A redirected entry is `jmp rel32` (e9) to the replacement itself, or to a
// slot of a patch-stub page near the module: a page that starts with
// kPatchPageMagic, then 16-byte slots `jmp *0(%rip); .quad target; int3 int3`
// (never one of the probe stubs' encodings, so detach and status never take a
// redirect for a probe, and a slot is written once and never reused for
// another target: a thread may be inside it).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "iprobe/probelist/probe_list.h"

#include "inject.h"
#include "modules.h"
#include "process.h"
#include "stubs.h"

namespace iprobe::hotpatch {

inline constexpr std::array<std::uint8_t, 16> kPatchPageMagic = {'i', 'p', 'r', 'o', 'b', 'e', '-', 'p',
                                                                 'a', 't', 'c', 'h', 'e', 's', '1', 0};
inline constexpr std::size_t kPatchStubSize = 16;

std::array<std::uint8_t, kPatchStubSize> patch_stub_bytes(std::uint64_t target);

struct Redirect {
    std::uint64_t stub = 0;    // the patch stub it goes through, 0 when direct
    std::uint64_t target = 0;  // the replacement
};

// What a 5-byte entry site holding `bytes` redirects to; nullopt when it is
// not a jump, or jumps into one of our probe stubs (a probe is on).
std::optional<Redirect> redirect_at(const ProcessMemory& memory, std::uint64_t site, const std::uint8_t* bytes,
                                    std::uint8_t size, StubChecker& stubs);

// A patch stub jumping to `target` reachable by a rel32 jump from every byte
// of `running`: an existing slot with that target, a free slot of an existing
// page, or a new page mapped near the module.
std::uint64_t patch_stub_for(StoppedProcess& process, const LoadedLibrary& libc, const RunningModule& running,
                             std::uint64_t target);

bool within_rel32(std::uint64_t from_end, std::uint64_t to);

}  // namespace iprobe::hotpatch

namespace iprobe::hotpatch {

// Drops from `selected` every probe of a function whose entry is redirected
// (attach must not overwrite a patch); returns those functions, once each.
// Sites outside the module's code are left for attach's own checks.
std::vector<std::string> drop_redirected(const ProcessMemory& memory, const probelist::ProbeList& list,
                                         const RunningModule& running, std::vector<const probelist::Probe*>& selected);

}  // namespace iprobe::hotpatch
