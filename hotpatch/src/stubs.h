// Jump stubs and the bytes of probe sites: how an enabled site is encoded
// (a call to a stub near its module, the stub an absolute jump to the
// handler), how to tell ours from any other code, and reading many sites
// of a process at once.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "iprobe/formats/probe_list.h"
#include "iprobe/formats/rt_layout.h"
#include "process.h"

namespace iprobe::hotpatch {

constexpr std::size_t kStubSize = 16;

std::string hex_address(std::uint64_t v);

// A module's shared stub, one per handler: jmp *2(%rip); int3 int3; .quad target
std::array<std::uint8_t, kStubSize> stub_bytes(std::uint64_t target);

// A site's own stub, in an area near its module with one slot per probe id:
// it hands the handler the site's identity in edi (free at a call-form site,
// whose call may clobber it), so the handler finds its counters without
// hashing the return address.
//   mov $id, %edi; jmp *0(%rip); .quad target; int3 padding
constexpr std::size_t kSiteStubSize = IPROBE_RT_SITE_STUB_SIZE;
std::array<std::uint8_t, kSiteStubSize> site_stub_bytes(std::uint32_t id, std::uint64_t target);

// A count site's stub with the runtime's count handler inlined: a thread
// that has its sums (a pointer at %fs:stats_tpoff, see iprobe_rt_state)
// bumps the counter at `counter_offset` in them and returns; any other
// passes the offset to `slow_target` (iprobe_rt_count_counter) as above.
//   mov %fs:tpoff, %rax; test %rax, %rax; je slow; addq $1, off(%rax); ret
//   slow: mov $off, %edi; jmp *0(%rip); .quad slow_target
// One add instruction, so a signal handler in between never loses a count.
std::array<std::uint8_t, kSiteStubSize> count_stub_bytes(std::int32_t stats_tpoff, std::uint32_t counter_offset,
                                                         std::uint64_t slow_target);

// A function-entry site's stub (entry_sites.h): the site is a `jmp` to it,
// so the return stack buffer sees no call the function did not make.  It
// pushes the site's end and id and jumps to the handler (ENTRY_SITE_CALL in
// runtime/include/iprobe/runtime/save_call_restore.inc), changing no
// register: with gcc's IPA-RA a caller keeps values in any register the
// function leaves alone, r11 included.
//   push site_end_q(%rip); push $id; jmp *0(%rip); .quad target; site_end_q: .quad site_end
constexpr std::size_t kEntryStubSize = 33;
std::array<std::uint8_t, kSiteStubSize> entry_stub_bytes(std::uint32_t id, std::uint64_t site_end,
                                                         std::uint64_t target);

// The count handler inlined at a function-entry site: a thread with its
// sums bumps `calls` and jumps straight back to the site's end; any other
// takes entry_stub_bytes' path to `slow_target`.  r11 is kept on the stack
// (flags are not kept: gcc keeps no comparison across a call).
//   push %r11; mov %fs:tpoff, %r11; test %r11, %r11; je 1f; addq $1, calls(%r11)
//   1: pop %r11; jne site_end;  slow: entry_stub_bytes(calls, site_end, slow_target)
// `at` is where the stub is written (the jne is relative to it).
std::array<std::uint8_t, kSiteStubSize> entry_count_stub_bytes(std::int32_t stats_tpoff, std::uint32_t calls,
                                                               std::uint64_t at, std::uint64_t site_end,
                                                               std::uint64_t slow_target);

// The handler a stub of either kind jumps to, or 0 when the `size` bytes at
// `stub` are not one of ours.
std::uint64_t stub_target(const std::uint8_t* stub, std::size_t size = kStubSize);

// The few bytes of one site, kept inline: a 10k-probe attach builds 10k of
// these while the target is stopped, so no heap allocation per site.
struct SiteBytes {
    std::array<std::uint8_t, IPROBE_PL_SITE_MAX> bytes{};
    std::uint8_t size = 0;

    SiteBytes() = default;
    SiteBytes(const std::uint8_t* from, std::uint8_t n) : size(n) { std::memcpy(bytes.data(), from, n); }
    const std::uint8_t* begin() const { return bytes.data(); }
    const std::uint8_t* end() const { return bytes.data() + size; }
};

// The bytes an enabled site holds: call rel32 to the stub; a 6-byte site
// gets its 1-byte NOP first so the call returns to the site's end, which is
// an instruction boundary in both forms.
SiteBytes call_bytes(std::uint64_t site, std::uint8_t size, std::uint64_t stub);
// A function-entry site's bytes when on: jmp rel32 to its stub.
SiteBytes jump_bytes(std::uint64_t site, std::uint8_t size, std::uint64_t stub);
// Where a site placed by call_bytes() or jump_bytes() leads, or 0.
std::uint64_t called_stub(std::uint64_t site, const std::uint8_t* bytes, std::uint8_t size);

// Does a site call into one of our jump stubs (ours, or one inherited from a
// parent process across fork)?  Stubs are few: each is read once.
class StubChecker {
public:
    explicit StubChecker(const ProcessMemory& memory) : memory_(memory) {}
    bool calls_a_stub(std::uint64_t site, const std::uint8_t* bytes, std::uint8_t size);

private:
    const ProcessMemory& memory_;
    std::map<std::uint64_t, bool> known_;
};

using SiteText = std::array<std::uint8_t, IPROBE_PL_SITE_MAX>;

// The bytes at each address.  Sites close together share one read; far
// apart ones are read apart, so no buffer ever spans the gap between the
// lowest and the highest site (a bad address costs one failed read, not a
// gigabyte).
std::vector<SiteText> read_sites(const ProcessMemory& memory, const std::vector<std::uint64_t>& addresses);

}  // namespace iprobe::hotpatch
