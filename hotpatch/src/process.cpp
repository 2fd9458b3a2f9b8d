#include "process.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "iprobe/support/error.h"
#include "iprobe/support/proc.h"

namespace iprobe::hotpatch {

namespace {

std::string proc_path(pid_t pid, const char* leaf) { return "/proc/" + std::to_string(pid) + "/" + leaf; }

std::string tracer_of(pid_t pid) { return proc::status_field(pid, "TracerPid").value_or("0"); }

}  // namespace

// Not in the anonymous namespace: StoppedProcess::throw_gone() forwards here.
[[noreturn]] void throw_gone(pid_t pid) {
    throw Error("process " + std::to_string(pid) + " exited while iprobe was attached; nothing was left changed",
                ExitCode::failure);
}

// Alive and not dying: a zombie leader still answers kill(pid, 0).
bool process_alive(pid_t pid) {
    const char state = proc::state(pid);
    return state != 0 && state != 'Z' && state != 'X';
}

std::vector<Mapping> read_maps(pid_t pid) { return proc::read_maps(pid); }

std::vector<pid_t> list_threads(pid_t pid) { return proc::threads(pid); }

bool process_exists(pid_t pid) { return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM); }

void check_target(pid_t pid) {
    if (pid <= 0) throw Error("invalid pid " + std::to_string(pid), ExitCode::usage);
    if (::kill(pid, 0) != 0 && errno == ESRCH)
        throw Error("no such process: " + std::to_string(pid), ExitCode::not_found);
    if (pid == ::getpid()) throw Error("iprobe cannot attach to itself", ExitCode::usage);
    const char state = proc::state(pid);
    if (state == 'Z' || state == 'X') throw Error("process " + std::to_string(pid) + " is a zombie", ExitCode::not_found);
    // The kernel's ptrace access check guards /proc/PID/mem: ask it early.
    UniqueFd mem(::open(proc_path(pid, "mem").c_str(), O_RDONLY | O_CLOEXEC));
    if (!mem && (errno == EACCES || errno == EPERM))
        throw Error("not permitted to ptrace process " + std::to_string(pid) +
                        ": run as root or as its owner (check /proc/sys/kernel/yama/ptrace_scope)",
                    ExitCode::permission);
}

namespace {

std::atomic<bool> g_interrupted{false};

using Clock = std::chrono::steady_clock;
// A seized thread stops within microseconds unless it sleeps uninterruptibly
// (state D: NFS, a frozen cgroup, a vfork parent): give up after this.
constexpr auto kStopTimeout = std::chrono::seconds(2);
// After the process died or we let go, how long to collect its exits.
constexpr auto kReapTimeout = std::chrono::milliseconds(500);

int event_of(int status) { return static_cast<int>(static_cast<unsigned>(status) >> 16); }

// Between sweeps: short first (a stop takes microseconds), then longer, so a
// wait costs little CPU while the target's threads need it to reach their
// stops.
void pause_between_sweeps(int sweep) {
    std::this_thread::sleep_for(std::chrono::microseconds(sweep < 20 ? 10 : sweep < 200 ? 100 : 1000));
}

}  // namespace

void interrupt() noexcept { g_interrupted.store(true, std::memory_order_relaxed); }
bool interrupted() noexcept { return g_interrupted.load(std::memory_order_relaxed); }
void throw_if_interrupted() {
    if (interrupted())
        throw Error("interrupted; everything done so far was undone and the process left running",
                    ExitCode::interrupted);
}

StoppedProcess::StoppedProcess(pid_t pid) : pid_(pid) {
    check_target(pid);
    try {
        seize_all();
        memory_ = ProcessMemory(pid);
    } catch (...) {
        release();
        throw;
    }
}

StoppedProcess::~StoppedProcess() { release(); }

void StoppedProcess::throw_gone() const { hotpatch::throw_gone(pid_); }

void StoppedProcess::forget(pid_t tid) {
    std::erase_if(threads_, [&](const StoppedThread& t) { return t.tid == tid; });
    std::erase(pending_, tid);
    if (tid == pid_) leader_gone_ = true;
}

bool StoppedProcess::next_report(Report& report, Deadline deadline, bool interruptible) {
    for (int sweep = 0;; sweep++) {
        // Copies: absorb() may change the lists of whoever called us.
        std::vector<pid_t> tids = pending_;
        for (const auto& t : threads_) tids.push_back(t.tid);
        for (pid_t tid : tids) {
            int status = 0;
            const pid_t r = ::waitpid(tid, &status, __WALL | WNOHANG);
            if (r == tid) {
                report = {tid, status};
                return true;
            }
            if (r < 0 && errno == ECHILD) {
                // Reaped by someone else or no longer ours: it is gone.
                report = {tid, 0};  // WIFEXITED(0)
                return true;
            }
        }
        if (tids.empty()) return false;
        if (interruptible) throw_if_interrupted();
        if (Clock::now() >= deadline) return false;
        pause_between_sweeps(sweep);
    }
}

bool StoppedProcess::absorb(const Report& report) {
    const pid_t tid = report.tid;
    const int status = report.status;
    if (WIFEXITED(status) || WIFSIGNALED(status)) {
        forget(tid);
        return false;
    }
    if (!WIFSTOPPED(status)) return false;
    const int event = event_of(status);
    const bool was_pending = std::find(pending_.begin(), pending_.end(), tid) != pending_.end();
    auto stopped = [&](int signal) {
        std::erase(pending_, tid);
        if (std::none_of(threads_.begin(), threads_.end(), [&](const StoppedThread& t) { return t.tid == tid; })) {
            StoppedThread thread{tid, {}, signal};
            ::ptrace(PTRACE_GETREGS, tid, nullptr, &thread.regs);
            threads_.push_back(thread);
        }
        return true;
    };
    switch (event) {
    case PTRACE_EVENT_STOP:
        if (was_pending) return stopped(0);
        return true;
    case PTRACE_EVENT_EXIT:
        // Dying (exit_group, a fatal signal): let it finish; its parent reaps it.
        ::ptrace(PTRACE_DETACH, tid, nullptr, nullptr);
        forget(tid);
        return false;
    case PTRACE_EVENT_CLONE: {
        unsigned long child = 0;
        if (::ptrace(PTRACE_GETEVENTMSG, tid, nullptr, &child) == 0 &&
            std::find(pending_.begin(), pending_.end(), static_cast<pid_t>(child)) == pending_.end())
            pending_.push_back(static_cast<pid_t>(child));
        break;
    }
    case 0:
        // A signal arrived before our interrupt: keep the thread stopped
        // here and hand the signal back when it is resumed.
        if (was_pending) return stopped(WSTOPSIG(status));
        break;
    default:
        break;
    }
    // Any other stop of a thread we want stopped: let it go on to our interrupt.
    ::ptrace(PTRACE_CONT, tid, nullptr, nullptr);
    ::ptrace(PTRACE_INTERRUPT, tid, nullptr, nullptr);
    return false;
}

void StoppedProcess::wait_pending_stopped(Deadline deadline) {
    Report report;
    while (!pending_.empty()) {
        if (leader_gone_) throw_gone();
        if (!next_report(report, deadline)) {
            if (!process_alive(pid_)) throw_gone();
            throw Error("thread " + std::to_string(pending_.front()) + " of process " + std::to_string(pid_) +
                            " did not stop within " + std::to_string(kStopTimeout.count()) +
                            " s (an uninterruptible sleep, state D?); nothing was changed; retry",
                        ExitCode::busy);
        }
        absorb(report);
    }
    if (leader_gone_) throw_gone();
}

void StoppedProcess::seize_all() {
    constexpr long options = PTRACE_O_TRACECLONE | PTRACE_O_TRACEEXIT;
    // Threads may be created while we stop the others: repeat until the
    // task list holds nothing we have not stopped (new clones of stopped
    // threads are auto-attached and show up as PTRACE_EVENT_CLONE).
    for (int round = 0;; round++) {
        bool added = false;
        for (pid_t tid : list_threads(pid_)) {
            const bool known = std::any_of(threads_.begin(), threads_.end(),
                                           [&](const StoppedThread& t) { return t.tid == tid; }) ||
                               std::find(pending_.begin(), pending_.end(), tid) != pending_.end();
            if (known) continue;
            const char state = proc::state(pid_, tid);
            if (state == 'Z' || state == 'X' || state == 0) {
                if (tid == pid_) throw_gone();
                continue;
            }
            if (::ptrace(PTRACE_SEIZE, tid, nullptr, reinterpret_cast<void*>(options)) != 0) {
                if (errno == ESRCH) {  // exited meanwhile
                    if (tid == pid_) throw_gone();
                    continue;
                }
                if (errno == EPERM) {
                    const std::string tracer = tracer_of(pid_);
                    if (tracer != "0")
                        throw Error("process " + std::to_string(pid_) + " is already traced by pid " + tracer +
                                        " (a debugger or another iprobe); detach it first",
                                    ExitCode::busy);
                    throw Error("not permitted to ptrace process " + std::to_string(pid_) +
                                    ": run as root or as its owner (check /proc/sys/kernel/yama/ptrace_scope)",
                                ExitCode::permission);
                }
                throw_errno("PTRACE_SEIZE " + std::to_string(tid));
            }
            pending_.push_back(tid);
            ::ptrace(PTRACE_INTERRUPT, tid, nullptr, nullptr);
            added = true;
        }
        wait_pending_stopped(Clock::now() + kStopTimeout);
        if (!added) break;
        if (round > 1000) throw Error("process " + std::to_string(pid_) + " keeps creating threads; try again");
    }
    if (threads_.empty() || !process_alive(pid_)) throw_gone();
    for (auto& thread : threads_)
        if (::ptrace(PTRACE_GETREGS, thread.tid, nullptr, &thread.regs) != 0) throw_gone();
}

void StoppedProcess::release() {
    if (released_) return;
    released_ = true;
    std::vector<pid_t> dying;
    for (auto& thread : threads_)
        if (::ptrace(PTRACE_DETACH, thread.tid, nullptr,
                     reinterpret_cast<void*>(static_cast<long>(thread.pending_signal))) != 0)
            dying.push_back(thread.tid);  // killed while stopped: a zombie of ours until waited for
    threads_.clear();
    // Threads seized or auto-attached but not stopped yet (an exception
    // mid-way): detaching needs them stopped.  Exits are collected too, so the
    // parent of a process that died under us can reap it at once.
    pending_.insert(pending_.end(), dying.begin(), dying.end());
    const auto deadline = Clock::now() + kReapTimeout;
    Report report;
    while (!pending_.empty() && Clock::now() < deadline) {
        bool got = false;
        got = next_report(report, deadline, false);  // interrupted or not: finish letting go
        if (!got) break;
        if (absorb(report)) {
            for (auto& thread : threads_)
                ::ptrace(PTRACE_DETACH, thread.tid, nullptr,
                         reinterpret_cast<void*>(static_cast<long>(thread.pending_signal)));
            threads_.clear();
        }
    }
    // Anything left is let go by the kernel when this process exits.
    pending_.clear();
}

ProcessMemory::ProcessMemory(pid_t pid) : pid_(pid) {
    mem_.reset(::open(proc_path(pid, "mem").c_str(), O_RDWR | O_CLOEXEC));
    if (!mem_) throw_errno("cannot open /proc/" + std::to_string(pid) + "/mem", ExitCode::permission);
}

void ProcessMemory::read(std::uint64_t address, void* out, std::size_t size) const {
    auto* p = static_cast<char*>(out);
    while (size > 0) {
        const ssize_t n = ::pread(mem_.get(), p, size, static_cast<off_t>(address));
        if (n <= 0) {
            if (n < 0 && errno == EINTR) continue;
            if (!process_alive(pid_)) throw_gone(pid_);
            throw Error("cannot read target memory at 0x" + [&] {
                std::ostringstream s;
                s << std::hex << address;
                return s.str();
            }() + ": " + std::strerror(errno));
        }
        p += n, address += static_cast<std::uint64_t>(n), size -= static_cast<std::size_t>(n);
    }
}

void ProcessMemory::write(std::uint64_t address, const void* data, std::size_t size) {
    const auto* p = static_cast<const char*>(data);
    while (size > 0) {
        const ssize_t n = ::pwrite(mem_.get(), p, size, static_cast<off_t>(address));
        if (n <= 0) {
            if (n < 0 && errno == EINTR) continue;
            if (!process_alive(pid_)) throw_gone(pid_);
            std::ostringstream s;
            s << "cannot write target memory at 0x" << std::hex << address << ": " << std::strerror(errno);
            throw Error(s.str());
        }
        p += n, address += static_cast<std::uint64_t>(n), size -= static_cast<std::size_t>(n);
    }
}

StoppedThread& StoppedProcess::call_thread() {
    // Prefer a thread stopped by our interrupt (not holding a signal).
    for (auto& thread : threads_)
        if (thread.pending_signal == 0) return thread;
    return threads_.front();
}

std::uint64_t StoppedProcess::call(std::uint64_t function, std::vector<std::uint64_t> args,
                                   const std::string* string_arg, std::chrono::milliseconds timeout) {
    throw_if_interrupted();
    StoppedThread& chosen = call_thread();
    const pid_t tid = chosen.tid;
    auto thread = [&]() -> StoppedThread& {
        for (auto& t : threads_)
            if (t.tid == tid) return t;
        throw_gone();
    };
    user_regs_struct saved{};
    user_fpregs_struct saved_fp{};
    if (::ptrace(PTRACE_GETREGS, tid, nullptr, &saved) != 0 || ::ptrace(PTRACE_GETFPREGS, tid, nullptr, &saved_fp) != 0)
        throw_gone();

    user_regs_struct regs = saved;
    std::uint64_t sp = saved.rsp - 128 - 256;  // below the red zone, with room
    if (string_arg) {
        sp -= string_arg->size() + 1;
        sp &= ~std::uint64_t{15};
        write(sp, string_arg->c_str(), string_arg->size() + 1);
        args.insert(args.begin(), sp);
    }
    sp &= ~std::uint64_t{15};
    sp -= 8;  // return address 0: the call ends in a SIGSEGV at rip 0
    const std::uint64_t trap_return = 0;
    write(sp, &trap_return, sizeof trap_return);
    regs.rsp = sp;
    regs.rip = function;
    regs.rax = 0;
    // No syscall restart on the way in: the thread may sit in an interrupted syscall.
    regs.orig_rax = static_cast<unsigned long long>(-1);
    unsigned long long* arg_regs[] = {&regs.rdi, &regs.rsi, &regs.rdx, &regs.rcx, &regs.r8, &regs.r9};
    for (std::size_t i = 0; i < args.size() && i < 6; i++) *arg_regs[i] = args[i];

    auto restore = [&] {
        ::ptrace(PTRACE_SETREGS, tid, nullptr, &saved);
        ::ptrace(PTRACE_SETFPREGS, tid, nullptr, &saved_fp);
    };
    if (::ptrace(PTRACE_SETREGS, tid, nullptr, &regs) != 0) throw_gone();
    if (::ptrace(PTRACE_CONT, tid, nullptr, nullptr) != 0) throw_gone();

    // Not interruptible: stopping a thread inside dlopen would leave the
    // loader's lock held.  The call is bounded by `timeout` instead.
    const auto deadline = Clock::now() + timeout;
    Report report;
    for (;;) {
        if (!next_report(report, deadline, false)) {
            if (leader_gone_ || !process_alive(pid_)) throw_gone();
            // Stuck (a lock held by a stopped thread?): take the thread
            // back; its call is abandoned, the process keeps running.
            ::ptrace(PTRACE_INTERRUPT, tid, nullptr, nullptr);
            const auto stop_deadline = Clock::now() + kStopTimeout;
            while (next_report(report, stop_deadline, false)) {
                if (report.tid == tid && WIFSTOPPED(report.status)) {
                    restore();
                    break;
                }
                absorb(report);
                if (leader_gone_) throw_gone();
            }
            throw Error("a function call inside process " + std::to_string(pid_) + " did not return within " +
                        std::to_string(timeout.count()) + " ms; the process may be holding a lock; try again");
        }
        if (report.tid != tid) {
            // Another thread: its exit means the process is dying; a new
            // thread reports its first stop.
            absorb(report);
            if (leader_gone_) throw_gone();
            continue;
        }
        const int status = report.status;
        if (WIFEXITED(status) || WIFSIGNALED(status)) {
            forget(tid);
            throw_gone();
        }
        if (!WIFSTOPPED(status)) continue;
        const int event = event_of(status);
        const int sig = WSTOPSIG(status);
        if (event == 0 && sig == SIGSEGV) {
            user_regs_struct after{};
            ::ptrace(PTRACE_GETREGS, tid, nullptr, &after);
            restore();
            if (after.rip == trap_return) {
                wait_pending_stopped(Clock::now() + kStopTimeout);
                return after.rax;
            }
            throw Error("a function call inside process " + std::to_string(pid_) +
                        " crashed (SIGSEGV); registers restored");
        }
        if (event == PTRACE_EVENT_EXIT) {
            ::ptrace(PTRACE_DETACH, tid, nullptr, nullptr);
            forget(tid);
            throw_gone();
        }
        if (event == PTRACE_EVENT_CLONE) {
            unsigned long child = 0;
            if (::ptrace(PTRACE_GETEVENTMSG, tid, nullptr, &child) == 0) pending_.push_back(static_cast<pid_t>(child));
        } else if (event == 0 && thread().pending_signal == 0) {
            thread().pending_signal = sig;  // deliver later
        }
        ::ptrace(PTRACE_CONT, tid, nullptr, nullptr);
    }
}

}  // namespace iprobe::hotpatch
