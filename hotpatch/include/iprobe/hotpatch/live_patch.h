// Replacing a function of a running process (`iprobe patch`, docs/active-debugging.md):
// its replacement is loaded from a shared object with the same injection as
// the runtime (dlopen in the target), and the function's patchable entry (the
// 5-byte NOP of the entry and LLVM flows) becomes a `jmp` to it, directly
// when it lies within ±2 GiB, else through an absolute jump in a stub page
// near the module.  Written under the same stop-the-world safety as attach:
// no thread is inside the five bytes, threads already past them finish in the
// old code, new calls go to the new one.  Reverting puts the NOP back; the
// replacement stays loaded (a thread may still be in it).
//
// Which functions are patched, and with what, is read from the code itself
// (the entry's jump, the stub it goes through, the symbol it lands on), so
// it needs no state file, survives the tool exiting and dies with the process.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace iprobe::hotpatch {

struct FunctionPatch {
    // As the probe list names it: raw or demangled; a demangled C++ name may
    // leave out its parameter list when that leaves one function.
    std::string function;
    std::string library;  // the shared object holding the replacement
    std::string symbol;   // the replacement in `library`; empty = the function's own raw name
};

struct PatchOptions {
    pid_t pid = 0;
    std::vector<FunctionPatch> patches;
    // Probe lists or binaries naming the functions; empty = every module of
    // the process that has a probe list (beside it, or its LLVM section).
    std::vector<std::string> probe_sources;
    bool force = false;  // patch even where the DWARF signatures differ
    std::chrono::milliseconds safe_point_timeout{3000};
};

// A redirected function entry, as read from the target's code.
struct PatchedFunction {
    std::string function;      // demangled
    std::string module;        // the module holding the function
    std::uint64_t entry = 0;   // its address in the target
    std::string library;       // the module the entry leads into ("" when none is mapped there)
    std::string symbol;        // the function starting there ("" when no symbol does)
    std::uint64_t replacement = 0;
    std::uint64_t stub = 0;    // the absolute jump it goes through; 0: a direct jmp
    // patch only: how the signatures compared: "match", "forced" (they
    // differ; --force) or "unchecked" (no DWARF for one of them).
    std::string signature_check;
    std::string signature;     // the function's, when known
};

struct PatchStats {
    std::vector<PatchedFunction> patched;
    std::vector<std::string> injected;  // libraries loaded by this call
    std::size_t threads = 0;
    std::uint64_t pause_us = 0, stop_us = 0;
};

// Errors (iprobe::Error): not_found (no such function, library or symbol),
// bad_input (not a patchable entry: the finstrument flow; signatures differ;
// a function the runtime uses), busy (its probes are on: detach them first;
// another session), failure.  A failed patch writes nothing.
PatchStats patch(const PatchOptions& options);

struct RevertOptions {
    pid_t pid = 0;
    std::vector<std::string> functions;  // empty = every patched function
    std::vector<std::string> probe_sources;
    std::chrono::milliseconds safe_point_timeout{3000};
};

struct RevertStats {
    std::vector<PatchedFunction> reverted;
    std::size_t threads = 0;
    std::uint64_t pause_us = 0, stop_us = 0;
};

RevertStats revert(const RevertOptions& options);

// Every patched function entry of the process's modules that have probe lists.
std::vector<PatchedFunction> patched_functions(pid_t pid);

}  // namespace iprobe::hotpatch
