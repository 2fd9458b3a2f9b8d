// Independent checks of a binary for the coldpatch suites: they read the
// disassembly from binutils' objdump, not from iprobe's own decoder, so a
// bug in coldpatch cannot hide itself.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "iprobe/probelist/probe_list.h"

namespace iprobe::test {

struct HookCalls {
    int enter = 0;       // call ... <__cyg_profile_func_enter...>
    int exit = 0;        // call ... <__cyg_profile_func_exit...>
    int tail_jumps = 0;  // jmp to a hook outside the PLT
    int total() const { return enter + exit; }
};

// Hook calls in the code of `binary` (PLT stubs excluded), per objdump -d.
HookCalls count_hook_calls(const std::string& binary);

// address -> "mnemonic operands" of every instruction, per objdump -d.
std::map<std::uint64_t, std::string> disassembly(const std::string& binary);

// Functions (symbol name -> address of the pad) whose first instruction,
// after an endbr64, is the entry flow's pad: five 1-byte `nop`s, or one
// `nopl D(%rax,%rax,1)` (coldpatched, or clang's).  Per objdump -d, so the set is
// binutils' view, not coldpatch's.
std::map<std::string, std::uint64_t> padded_functions(const std::string& binary);

// Every function whose first instruction is a pad (padded_functions) is an
// entry probe at that pad, every entry probe is such a pad, and each has
// its exit probe.
void expect_an_entry_probe_per_padded_function(const std::string& binary, const probelist::ProbeList& list);

// Compiles with the given shell command line (run in `dir`); fails the test
// with the compiler's stderr when it does not succeed.
void compile(const std::string& dir, const std::string& command_line);

// Checks what every probe promises against the unpatched and patched files:
// only probe sites differ, original bytes are the unpatched bytes, the
// placeholder is in the patched file and objdump decodes it as one NOP.
void expect_only_sites_changed(const std::string& unpatched, const std::string& patched, const probelist::ProbeList& list);

// Probes with a source location whose function is not in binutils' view of
// the site (addr2line -i: the function and every function inlined there).
// Returns "site function [chain]" lines; empty when all agree.
std::vector<std::string> probes_misnamed(const std::string& binary, const probelist::ProbeList& list);

// An LD_PRELOAD library (data/hook_recorder.c) recording, per hook call
// site actually executed, the function the compiler passed to the hook.
// Run an *unpatched* binary with recorder_env(log) added to its environment.
std::string hook_recorder();
std::vector<std::string> recorder_env(const std::string& log_path);

struct RecordedCheck {
    std::size_t sites = 0;              // distinct executed hook call sites
    std::vector<std::string> problems;  // a site without probe, or of the wrong kind
    std::vector<std::string> misnamed;  // the probe names another function than the hook received
    std::vector<std::string> misnamed_unflagged;  // ... and is not flagged as a shared site
};
// Compares what the hooks received with the probe list of the same layout.
RecordedCheck check_recorded(const std::string& log_path, const probelist::ProbeList& list);

std::uint64_t file_offset_of(const std::string& binary, std::uint64_t vaddr);

}  // namespace iprobe::test
