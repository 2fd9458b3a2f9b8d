// `iprobe run`: a program started with its probes on before any code of its
// own runs (constructors included), for whole runs of programs that others
// start, e.g. the servers an upstream test suite spawns.
//
// The program is exec'd with the runtime preloaded (LD_PRELOAD) and one end
// of a socket pair in IPROBE_RUN_FD.  The runtime's constructor says it is
// loaded, then waits on the socket (runtime/src/rt.c); the prober attaches as
// it would to any process, then releases it: byte 0 to go on, or an exit
// code the program then _exit()s with, if probes could not be enabled.  The
// constructor also takes the runtime back out of LD_PRELOAD, so what the
// program starts in turn runs as it would without iprobe.
#pragma once

#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "iprobe/hotpatch/hotpatch.h"

namespace iprobe::hotpatch {

// The two ends of the socket pair (close-on-exec; the program's end is
// handed over by exec_held).
struct HoldChannel {
    int program = -1;
    int prober = -1;
    static HoldChannel open();
};

// The runtime to preload for `options` (its runtime_library, or the
// installed one), as an absolute path; Error(not_found) if it is missing.
std::string runtime_to_preload(const AttachOptions& options);

// In the process that becomes the program: preload `runtime`, hand over the
// channel's program end, execvp(command).  Returns only if exec failed, with
// errno set; the prober is told so (the caller says why and exits 126/127
// as shells do).
void exec_held(const std::vector<std::string>& command, const std::string& runtime, int program_fd);

// The prober's side: waits until the program has loaded the runtime and is
// held, enables `options` in it, runs `before_release` (e.g. to map its
// region for a report at exit), releases it.  nullopt: the program could
// not be executed (exec_held failed; it says why).  On failure the program
// is told to exit with the error's code and the Error is rethrown.  Throws
// Error(unavailable) if the program exited (or exec'd something that
// ignores LD_PRELOAD: statically linked, set-user-ID) without loading the
// runtime.
std::optional<AttachStats> enable_when_held(int prober_fd, pid_t program, const AttachOptions& options,
                                            const std::function<void()>& before_release = {});

}  // namespace iprobe::hotpatch
