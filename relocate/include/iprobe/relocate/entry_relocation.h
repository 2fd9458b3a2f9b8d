// Function entries of code nobody prepared for probes (no pad): the first
// instructions of a function, at least the 5 bytes a `jmp rel32` needs, are
// moved into a trampoline of the site's own; the entry then jumps to the
// probe's stub, whose handler goes on through the trampoline, which jumps
// back to the first instruction left in place.  An `endbr64` at the entry
// stays where it is (indirect calls land on it) and the jump follows it.
//
// A site is only planned when that is safe whatever the program does:
//   - nothing may branch into the replaced bytes (a loop back to the entry,
//     a jump table's case at the top of the function, a jump from another
//     piece of code), so every executable byte of the module is decoded
//     (linear sweep, Capstone) and every direct branch, call and jump-table
//     entry it holds is checked against every entry;
//   - an indirect jump whose table cannot be read is taken to reach anything
//     in its function;
//   - each moved instruction must mean the same thing elsewhere: RIP-relative
//     operands are re-aimed, relative jumps and calls re-encoded with rel32;
//     loop/jrcxz/xbegin (rel8 or relative-only forms) and a call ending inside
//     the first 5 bytes (its callee would return into the jump) are refused;
//     a moved call pushes the return address the original would have (its
//     callee returns into the function's code, where unwinders, debuggers and
//     runtimes reading return addresses expect it) and jumps, so an indirect
//     call reading the stack, and a far call, are refused too;
//   - a caller may keep any value in any register the function leaves
//     alone (gcc's IPA-RA: r11 too, for a callee that does not write it):
//     the trampoline uses no register, and the probe's stubs, handlers and
//     return trampolines keep every register but those the function itself
//     changes (tests/hotpatch/registers_test.cpp, reloc_cases.S keeps_r11).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace iprobe::relocate {

// Why an entry cannot be relocated.
enum class Refusal : std::uint8_t {
    none = 0,
    too_short,          // fewer than 5 bytes after any endbr64
    branch_into_entry,  // a branch, call or jump-table case targets the bytes the jump would replace
    indirect_jump,      // the function has an indirect jump whose table could not be read
    unrelocatable,      // an instruction of the first bytes cannot run elsewhere
    undecodable,        // Capstone cannot decode the function
};

// "too short", "branch into entry", ... (how `iprobe list` says it)
std::string_view to_string(Refusal refusal);

inline constexpr std::size_t kJumpSize = 5;        // jmp rel32 at the site
inline constexpr std::size_t kMaxTrampoline = 64;  // a trampoline's slot

// Executable bytes of the module at their link-time address.
struct CodeRange {
    std::uint64_t address = 0;
    std::span<const std::uint8_t> bytes;
};

// A function symbol: [address, address + size).
struct FunctionRange {
    std::uint64_t address = 0;
    std::uint64_t size = 0;
};

struct EntryPlan {
    Refusal refusal = Refusal::none;
    std::string detail;       // what was found, for people (an address, an instruction)
    std::uint8_t skip = 0;    // bytes kept in place before the site: 4 for endbr64
    std::uint8_t length = 0;  // bytes from the site moved to the trampoline (>= kJumpSize)
    bool ok() const { return refusal == Refusal::none; }
};

// Reads `size` bytes at a link-time address of the module (jump tables in
// read-only data); false when the module has no such bytes.
using ReadBytes = std::function<bool(std::uint64_t address, void* out, std::size_t size)>;

// One plan per function (`functions` sorted by address, each inside `code`).
// Branches are collected from all of `code`, functions or not, so a jump from
// a part gcc split off (foo.cold) or from a function without a symbol counts.
std::vector<EntryPlan> plan_entries(std::span<const CodeRange> code, std::span<const FunctionRange> functions,
                                    const ReadBytes& read);

// The trampoline of a planned entry: `moved` holds the plan's `length` bytes
// found at `site`; the result runs at `at` and ends in a jump to site +
// length.  Throws Error when a target is beyond rel32 reach from `at` or the
// result exceeds kMaxTrampoline.
std::vector<std::uint8_t> trampoline(std::span<const std::uint8_t> moved, std::uint64_t site, std::uint64_t at);

}  // namespace iprobe::relocate
