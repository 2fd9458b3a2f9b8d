// Coldpatch: turn the placeholder calls a compiler emitted for
// -finstrument-functions (`call __cyg_profile_func_enter/exit`) into NOPs of
// the same length, or the five 1-byte NOPs of -fpatchable-function-entry=5,0
// into one 5-byte NOP, and record where they were in a probe list.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "iprobe/elf/elf_file.h"
#include "iprobe/probelist/probe_list.h"

namespace iprobe::coldpatch {

inline constexpr char kEnterHook[] = "__cyg_profile_func_enter";
inline constexpr char kExitHook[] = "__cyg_profile_func_exit";

// The NOPs that replace `e8 rel32` and `ff 15 rel32`: one instruction each,
// so no thread can be stopped inside a placeholder.
inline constexpr std::uint8_t kNop5[5] = {0x0f, 0x1f, 0x44, 0x00, 0x00};
inline constexpr std::uint8_t kNop6[6] = {0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00};

// What a scan of a linked binary found (nothing is written).
struct PlaceholderScan {
    probelist::ProbeList list;                      // normalized; module/build-id/flags/targets filled
    std::size_t hook_tail_jumps = 0;     // `jmp hook` sites: left alone (not a call)
    // Calls whose target is both hooks (static glibc aliases them), kind
    // inferred from code order.  iprobe-cc avoids this by linking distinct hooks.
    std::size_t kinds_inferred = 0;
};

// Finds every call to the hooks in the executable sections of `elf` (which
// must be x86-64) and describes it as a probe.  `module_name` goes into the list.
PlaceholderScan scan_placeholders(const elf::ElfFile& elf, const std::string& module_name);

// The section gcc's -fpatchable-function-entry lists each function's pad in.
inline constexpr char kPatchableEntriesSection[] = "__patchable_function_entries";

// The entry-NOP flow's pads (=5,0: five 1-byte NOPs, or their coldpatched
// 5-byte NOP) found in a linked binary.
struct PatchableEntryScan {
    // An entry and an exit probe per function whose first instruction (after
    // endbr64) is the pad, from the function symbols and from any records
    // left in __patchable_function_entries.
    std::vector<probelist::Probe> probes;
    // Records of pads of another size, or outside any function symbol.
    std::size_t foreign_pads = 0;
    // Functions (by .eh_frame_hdr) that start with the pad but have no
    // symbol (a stripped binary): padded, yet not probes.
    std::size_t unnamed_pads = 0;
};

PatchableEntryScan scan_patchable_entries(const elf::ElfFile& elf);

struct ColdpatchOptions {
    std::string output;       // patched binary; default: the input, in place
    std::string probes_path;  // default: <output>.probes
    // A binary without placeholders is not an error: report it in the outcome
    // (iprobe-cc links configure's conftest and the like).
    bool allow_no_placeholders = false;
};

enum class ColdpatchOutcome {
    patched,          // NOPs written, probe list written
    already_patched,  // FILE.probes matches the build-id and every site is a NOP: nothing to do
    no_placeholders,  // only with allow_no_placeholders; nothing written
    embedded,         // LLVM flow: the binary carries its probe records; nothing written
};

struct ColdpatchResult {
    ColdpatchOutcome outcome = ColdpatchOutcome::patched;
    std::string binary_path;
    std::string probes_path;
    probelist::ProbeList list;
    std::size_t entries = 0, exits = 0, points = 0;
    std::size_t hook_tail_jumps = 0;
    std::size_t kinds_inferred = 0;
    std::size_t foreign_pads = 0;   // patchable entries not of iprobe's =5,0 form
    std::size_t unnamed_pads = 0;   // padded functions without a symbol: not probes
    // Entry flow: functions without a pad listed as relocated entries, and
    // those that cannot be relocated either (no probe), with the reason.
    std::size_t relocated = 0;
    std::vector<probelist::RefusedFunction> refused;
    double elapsed_ms = 0;
};

// Patches `path` and writes its probe list, atomically: on any error (thrown
// as iprobe::Error) neither file has changed.  Refuses non-ELF, truncated or
// corrupt ELF, non-x86-64 input and (unless allowed) binaries without
// placeholders, with ExitCode::bad_input.
ColdpatchResult coldpatch(const std::string& path, const ColdpatchOptions& options = {});

// "coldpatched app: 1234 probes (617 entry, 617 exit) in 12 ms -> app.probes"
std::string summary_line(const ColdpatchResult& result);

}  // namespace iprobe::coldpatch
