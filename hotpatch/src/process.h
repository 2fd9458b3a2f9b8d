// A stopped process: every thread ptrace-seized and interrupted, memory
// through /proc/PID/mem, function calls inside the target.  The destructor
// always restores borrowed registers and detaches, whatever happened.
//
// The target may die at any moment, and the user may interrupt us: no wait
// here blocks for good.  Every tracee is polled (WNOHANG, all of them in each
// sweep, so a dying thread group's exits are collected in whatever order the
// kernel delivers them), each wait has a deadline, and interrupt() makes the
// next wait throw Error(interrupted).  Between sweeps we sleep until the
// kernel's SIGCHLD says a tracee stopped or exited (ChildEvents), not on a
// timer: a tracer that wakes every few microseconds preempts the very threads
// it waits for on their way to the stop.
#pragma once

#include <signal.h>
#include <sys/types.h>
#include <sys/user.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "iprobe/hotpatch/hotpatch.h"
#include "iprobe/support/error.h"
#include "iprobe/support/fd.h"
#include "iprobe/support/proc.h"

namespace iprobe::hotpatch {

using Mapping = proc::Mapping;

std::vector<Mapping> read_maps(pid_t pid);
std::vector<pid_t> list_threads(pid_t pid);
bool process_exists(pid_t pid);
// Alive and not dying (a zombie leader still answers kill(pid, 0)).
bool process_alive(pid_t pid);
// "process PID exited while iprobe was attached; nothing was left changed"
[[noreturn]] void throw_gone(pid_t pid);
// Runs `read` (a read of the target's files or memory); if it fails because
// the target is gone, says that instead of the raw error of the read.
template <typename Read>
auto reading_target(pid_t pid, Read&& read) {
    try {
        return read();
    } catch (const Error&) {
        if (!process_alive(pid)) throw_gone(pid);
        throw;
    }
}
// Throws Error(not_found / permission) when the pid cannot be a target.
void check_target(pid_t pid);

// /proc/PID/mem of a process, stopped or running.  Reads of a running
// process race with its own writes: whatever is planned from them is checked
// again once it is stopped.
class ProcessMemory {
public:
    ProcessMemory() = default;
    explicit ProcessMemory(pid_t pid);  // throws Error(permission) when it cannot be opened

    void read(std::uint64_t address, void* out, std::size_t size) const;
    void write(std::uint64_t address, const void* data, std::size_t size);
    template <typename T>
    T read_value(std::uint64_t address) const {
        T value{};
        read(address, &value, sizeof value);
        return value;
    }

private:
    pid_t pid_ = 0;
    UniqueFd mem_;
};

// Throws Error(interrupted) once interrupt() (iprobe/hotpatch/hotpatch.h) was called.
void throw_if_interrupted();

// While it lives, this thread takes the SIGCHLDs that ptrace stops and
// exits send their tracer (blocked here, waited for with sigtimedwait).
// Only where nobody else wants them: SIGCHLD at its default disposition and
// not already blocked (a handler or a signalfd of the program's own keeps
// every notification).  Otherwise, or when a SIGCHLD went to another thread
// of ours, wait() is a short sleep, as a poll.
class ChildEvents {
public:
    ChildEvents();
    ~ChildEvents();
    ChildEvents(const ChildEvents&) = delete;
    ChildEvents& operator=(const ChildEvents&) = delete;
    // Until a SIGCHLD (maybe one already pending), `poll_sleep` without
    // them, at most `limit`; EINTR (an interrupt()'s signal) ends it too.
    void wait(std::chrono::microseconds poll_sleep, std::chrono::microseconds limit) const;
    bool taken() const { return taken_; }

private:
    bool taken_ = false;
    sigset_t saved_{};
};

struct StoppedThread {
    pid_t tid = 0;
    user_regs_struct regs{};
    int pending_signal = 0;  // stopped at signal delivery: re-delivered on detach
};

class StoppedProcess {
public:
    explicit StoppedProcess(pid_t pid);
    ~StoppedProcess();
    StoppedProcess(const StoppedProcess&) = delete;
    StoppedProcess& operator=(const StoppedProcess&) = delete;

    pid_t pid() const { return pid_; }
    // When the first thread was interrupted (every thread was seized just
    // before, while all of them ran): where the target's pause begins.
    std::chrono::steady_clock::time_point stopping_began() const { return stopping_began_; }
    std::uint64_t stop_us = 0;  // how long stopping every thread took
    const std::vector<StoppedThread>& threads() const { return threads_; }

    const ProcessMemory& memory() const { return memory_; }
    void read(std::uint64_t address, void* out, std::size_t size) const { memory_.read(address, out, size); }
    void write(std::uint64_t address, const void* data, std::size_t size) { memory_.write(address, data, size); }
    template <typename T>
    T read_value(std::uint64_t address) const {
        return memory_.read_value<T>(address);
    }

    // Where the calls below return: code in the target that ends a call with
    // rt_sigreturn from the frame call() leaves above the return address,
    // which holds the borrowed thread's whole context (registers, FPU and
    // vector state, signal mask).  A thread in a call thus needs no tracer
    // to get back: if this process is killed at any moment of a call, the
    // thread finishes it and resumes exactly where it was stopped.
    //   sigreturn:   libc's own signal-return code (mov $15, %eax; syscall),
    //                found in every glibc; it keeps no result;
    //   with_result: the runtime's iprobe_rt_call_landing, which first keeps
    //                rax in the frame.
    struct CallLanding {
        std::uint64_t sigreturn = 0;
        std::uint64_t with_result = 0;
    };
    void set_landing(const CallLanding& landing) { landing_ = landing; }
    const CallLanding& landing() const { return landing_; }

    // Calls `function(args...)` in one stopped thread (set_landing() first).
    // Returns rax when the landing keeps it, else the result of the last
    // system call the function made (what libc's mmap or munmap returns, as
    // -errno on failure).  A string, when given, is copied below the red zone
    // and passed as the first argument.
    std::uint64_t call(std::uint64_t function, std::vector<std::uint64_t> args,
                       const std::string* string_arg = nullptr,
                       std::chrono::milliseconds timeout = std::chrono::seconds(20));
    // The errno of the first system call of the last call() that failed (0:
    // none), with its number: why a dlopen failed when no landing keeps
    // dlerror()'s answer.
    std::pair<long, int> last_call_failed_syscall() const { return failed_syscall_; }

    // Resumes and detaches everything now (also done by the destructor).
    void release();

private:
    struct Report {
        pid_t tid = 0;
        int status = 0;
    };
    using Deadline = std::chrono::steady_clock::time_point;

    void seize_all();
    // PTRACE_SEIZE of `tid` said EPERM: waits for it if it is ours already,
    // skips it if it exited, throws if another tracer holds it.
    void seize_refused(pid_t tid);
    // The next status change of any of our tracees; false at the deadline.
    // Throws Error(interrupted) after interrupt() when `interruptible`.
    bool next_report(Report& report, Deadline deadline, bool interruptible = true);
    // Folds a report into the thread lists; true when `report.tid` is now stopped.
    bool absorb(const Report& report);
    // Stopped, or seized and waited for.
    bool tracked(pid_t tid) const;
    void forget(pid_t tid);
    void wait_pending_stopped(Deadline deadline);
    [[noreturn]] void throw_gone() const;
    StoppedThread& call_thread();

    pid_t pid_;
    ChildEvents child_events_;
    std::chrono::steady_clock::time_point stopping_began_{};
    ProcessMemory memory_;
    std::vector<StoppedThread> threads_;  // ptrace-stopped
    std::vector<pid_t> pending_;          // seized or auto-attached, not stopped yet
    bool leader_gone_ = false;            // the thread-group leader exited: the process is dying
    CallLanding landing_;
    std::pair<long, int> failed_syscall_{-1, 0};
    bool released_ = false;
};

}  // namespace iprobe::hotpatch
