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
// program starts in turn runs as it would without iprobe.  A run that names
// modules also adds an audit module to LD_AUDIT, through which the program
// tells of its later loads on the same socket (PendingModules below;
// runtime/include/iprobe/runtime/run_loads.h).
#pragma once

#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "iprobe/hotpatch/hotpatch.h"
#include "iprobe/support/error.h"

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

// The libraries an `iprobe run` names (--module NAME, --probes SOURCE)
// that its program has not loaded (yet): each is probed when the program
// loads it (dlopen), before its code runs, and the ones it never loads are
// said at exit (include/iprobe/runtime/run_loads.h).  A run that names none
// probes the executable, which is always there.
class PendingModules {
public:
    // Every module and library source `options` names (none for
    // options.selections); a source of the executable is never pending.
    explicit PendingModules(const AttachOptions& options);
    bool empty() const { return entries_.empty(); }
    // The options of an attach of what of them process `pid` has loaded now,
    // taken out of the pending ones (described(), into `taken`); nullopt
    // when it has none of them.
    std::optional<AttachOptions> take_loaded(const AttachOptions& options, pid_t pid,
                                             std::vector<std::string>* taken = nullptr);
    // Whether any of the object names (l_name) a load batch reports may be
    // one of them ("*": the batch did not hold every name).
    bool may_be_among(const std::vector<std::string>& loaded) const;
    // As the user named them: "libx.so" (--module), "FILE" (--probes).
    std::vector<std::string> named() const;
    // The same with the option: "--module libx.so", "--probes FILE".
    std::vector<std::string> described() const;

private:
    struct Entry {
        std::string name;    // a module's file name, as module_source matches it
        std::string source;  // --probes SOURCE; empty for --module
    };
    std::vector<Entry> entries_;
    // --probes sources of the executable: not pending (it is there from
    // the start), attached by the first take_loaded.
    std::vector<std::string> executables_;
};

// The audit module `iprobe run` adds to LD_AUDIT so the program tells of
// its later loads: libiprobe-run-audit.so beside `runtime`.
std::string run_audit_library(const std::string& runtime);

// In the process that becomes the program: preload `runtime` (and, when
// `audit` is not empty, add it to LD_AUDIT), hand over the channel's program
// end, execvp(command).  Returns only if exec failed, with errno set; the
// prober is told so (the caller says why and exits 126/127 as shells do).
void exec_held(const std::vector<std::string>& command, const std::string& runtime, int program_fd,
               const std::string& audit = {});

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

// What a module the program loaded later came to.
struct LaterAttach {
    std::vector<std::string> named;  // PendingModules::described() of what it attached (or tried to)
    std::optional<AttachStats> stats;  // nullopt: the attach failed ...
    std::string error;                 // ... saying this
    ExitCode code = ExitCode::ok;
};

// The same for a run that names modules: attaches what of `pending` the
// program has loaded at its start (nothing, and no region made, if none of
// it), takes that out of `pending`.  `when_held` runs as soon as the program
// is held (e.g. to note its executable), `before_release` only if something
// was attached.  While modules stay pending, an attach that finds nothing
// (not_found: a --functions meant for a library still to come) releases the
// program all the same and is told to `unprobed`.  nullopt: exec failed;
// AttachStats::selected 0: nothing was attached.
std::optional<AttachStats> enable_loaded_when_held(int prober_fd, pid_t program, const AttachOptions& options,
                                                   PendingModules& pending,
                                                   const std::function<void()>& before_release = {},
                                                   const std::function<void()>& when_held = {},
                                                   const std::function<void(const LaterAttach&)>& unprobed = {});


// Serves the program's later loads until nothing is pending, the program
// (and every process that kept its end) is gone, or the channel is shut
// down: each load of a pending module is attached while the program waits
// inside its dlopen, `after_attach` runs (success or not), and then the
// program goes on.  Runs on its own thread beside the one waiting for the
// program.  Throws nothing: a failed attach leaves the program going on
// unprobed and is told through `after_attach`.
void serve_later_loads(int prober_fd, pid_t program, const AttachOptions& options, PendingModules& pending,
                       const std::function<void(const LaterAttach&)>& after_attach);

}  // namespace iprobe::hotpatch
