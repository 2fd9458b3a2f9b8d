// Independent checks of a binary for the coldpatch suites: they read the
// disassembly from binutils' objdump, not from iprobe's own decoder, so a
// bug in coldpatch cannot hide itself.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "iprobe/probe_list.hpp"

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

// Compiles with the given shell command line (run in `dir`); fails the test
// with the compiler's stderr when it does not succeed.
void compile(const std::string& dir, const std::string& command_line);

// Checks what every probe promises against the unpatched and patched files:
// only probe sites differ, original bytes are the unpatched bytes, the
// placeholder is in the patched file and objdump decodes it as one NOP.
void expect_only_sites_changed(const std::string& unpatched, const std::string& patched, const ProbeList& list);

std::uint64_t file_offset_of(const std::string& binary, std::uint64_t vaddr);

}  // namespace iprobe::test
