#include "process.h"

#include <cpuid.h>
#include <dirent.h>
#include <elf.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "iprobe/support/error.h"
#include "iprobe/support/proc.h"

namespace iprobe::hotpatch {

namespace {

std::string proc_path(pid_t pid, const char* leaf) { return "/proc/" + std::to_string(pid) + "/" + leaf; }

// TracerPid of a thread, "0" when untraced; nullopt when it is gone.
std::optional<std::string> tracer_of(pid_t pid, pid_t tid) { return proc::status_field(pid, "TracerPid", tid); }

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

// Threads of `pid` other than its leader that are not exiting (a process
// whose main thread called pthread_exit keeps running on them).  A thread
// of a process being killed, or whose process called exit_group, may be R
// or S a moment longer; it has SIGKILL pending from then on (the kernel
// gives it one), and PF_EXITING (0x4 in stat's flags) once do_exit began.
static std::size_t live_threads_besides_leader(pid_t pid) {
    constexpr unsigned long kExiting = 0x4, kKill = 1ul << (SIGKILL - 1);
    auto number = [](const std::optional<std::string>& text, int base) {
        return text ? std::strtoul(text->c_str(), nullptr, base) : ~0ul;  // gone: as dying
    };
    std::size_t live = 0;
    for (pid_t tid : proc::threads(pid)) {
        if (tid == pid) continue;
        const char state = proc::state(pid, tid);
        const bool dying = (number(proc::stat_field(pid, 9, tid), 10) & kExiting) ||
                           (number(proc::status_field(pid, "SigPnd", tid), 16) & kKill) ||
                           (number(proc::status_field(pid, "ShdPnd", tid), 16) & kKill);
        live += state != 0 && state != 'Z' && state != 'X' && !dying;
    }
    return live;
}

void check_target(pid_t pid) {
    if (pid <= 0) throw Error("invalid pid " + std::to_string(pid), ExitCode::usage);
    if (::kill(pid, 0) != 0 && errno == ESRCH)
        throw Error("no such process: " + std::to_string(pid), ExitCode::not_found);
    if (pid == ::getpid()) throw Error("iprobe cannot attach to itself", ExitCode::usage);
    const char state = proc::state(pid);
    if (state == 'Z' || state == 'X') {
        // Looked at again a moment later: a thread between taking its
        // SIGKILL and do_exit shows neither.
        std::size_t running = live_threads_besides_leader(pid);
        for (int look = 0; look < 3 && running; look++) {
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
            running = live_threads_besides_leader(pid);
        }
        if (running)
            throw Error("process " + std::to_string(pid) + "'s main thread has exited, but " + std::to_string(running) +
                            " other thread(s) still run in it: iprobe reaches a process through its main thread's "
                            "/proc entries (maps, mem, exe), which the kernel empties when that thread exits; such "
                            "a process cannot be attached to (start the program under 'iprobe run' instead)",
                        ExitCode::bad_input);
        throw Error("process " + std::to_string(pid) + " is a zombie (it exited; its parent has not reaped it): nothing runs in it",
                    ExitCode::not_found);
    }
    if (proc::kernel_thread(pid))
        throw Error("process " + std::to_string(pid) + " (" + proc::stat_field(pid, 2).value_or("?") +
                        ") is a kernel thread: it runs no user code, there is nothing to probe",
                    ExitCode::bad_input);
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

// Between sweeps without SIGCHLD: short first (a stop takes microseconds),
// then longer, so a wait costs little CPU while the target's threads need it
// to reach their stops.
std::chrono::microseconds poll_sleep(int sweep) {
    return std::chrono::microseconds(sweep < 20 ? 10 : sweep < 200 ? 100 : 1000);
}
// With SIGCHLD: how long a wait lasts when one went astray (to another
// thread of ours) before the tracees are swept again anyway.
constexpr std::chrono::microseconds kSigchldMissed{1000};

}  // namespace

void interrupt() noexcept { g_interrupted.store(true, std::memory_order_relaxed); }
bool interrupted() noexcept { return g_interrupted.load(std::memory_order_relaxed); }
void throw_if_interrupted() {
    if (interrupted())
        throw Error("interrupted; everything done so far was undone and the process left running",
                    ExitCode::interrupted);
}

ChildEvents::ChildEvents() {
    struct sigaction current {};
    if (::sigaction(SIGCHLD, nullptr, &current) != 0 || (current.sa_flags & SA_SIGINFO) || current.sa_handler != SIG_DFL)
        return;
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    if (::pthread_sigmask(SIG_BLOCK, &chld, &saved_) != 0) return;
    if (sigismember(&saved_, SIGCHLD)) return;  // blocked by the program: its own to take
    taken_ = true;
}

ChildEvents::~ChildEvents() {
    if (!taken_) return;
    // A SIGCHLD still pending is dropped when unblocked (its default is to
    // ignore it); take it first all the same, so none is left for later.
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    const timespec none{0, 0};
    while (::sigtimedwait(&chld, nullptr, &none) == SIGCHLD) {
    }
    ::pthread_sigmask(SIG_SETMASK, &saved_, nullptr);
}

void ChildEvents::wait(std::chrono::microseconds poll_sleep, std::chrono::microseconds limit) const {
    limit = std::max(limit, std::chrono::microseconds(1));
    if (!taken_) {
        std::this_thread::sleep_for(std::min(poll_sleep, limit));
        return;
    }
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::min(limit, kSigchldMissed)).count();
    const timespec timeout{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
    ::sigtimedwait(&chld, nullptr, &timeout);  // a SIGCHLD, EAGAIN at the timeout, EINTR: sweep again
}

StoppedProcess::StoppedProcess(pid_t pid) : pid_(pid) {
    check_target(pid);
    try {
        // Opened before the first thread stops: the stop holds only ptrace.
        memory_ = ProcessMemory(pid);
        seize_all();
    } catch (...) {
        release();
        throw;
    }
}

StoppedProcess::~StoppedProcess() { release(); }

void StoppedProcess::throw_gone() const { hotpatch::throw_gone(pid_); }

bool StoppedProcess::tracked(pid_t tid) const {
    return std::any_of(threads_.begin(), threads_.end(), [&](const StoppedThread& t) { return t.tid == tid; }) ||
           std::find(pending_.begin(), pending_.end(), tid) != pending_.end();
}

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
        const auto now = Clock::now();
        if (now >= deadline) return false;
        child_events_.wait(poll_sleep(sweep), std::chrono::duration_cast<std::chrono::microseconds>(deadline - now));
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
        // Not tracked yet, unless seize_refused() took it first.
        if (::ptrace(PTRACE_GETEVENTMSG, tid, nullptr, &child) == 0 && !tracked(static_cast<pid_t>(child)))
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
    // TRACESYSGOOD: a system-call stop of a call() is told from a SIGTRAP,
    // and if we die during one the kernel resumes the thread with no signal.
    constexpr long options = PTRACE_O_TRACECLONE | PTRACE_O_TRACEEXIT | PTRACE_O_TRACESYSGOOD;
    // Threads may be created while we stop the others: repeat until the
    // task list holds nothing we have not stopped (new clones of stopped
    // threads are auto-attached and show up as PTRACE_EVENT_CLONE).
    // Each round seizes every thread it finds (that stops none of them), then
    // interrupts them all at once: the first thread stops when the last is
    // about to, not a seize per thread earlier.
    for (int round = 0;; round++) {
        std::vector<pid_t> seized;
        for (pid_t tid : list_threads(pid_)) {
            if (tracked(tid)) continue;
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
                    seize_refused(tid);
                    continue;
                }
                throw_errno("PTRACE_SEIZE " + std::to_string(tid));
            }
            pending_.push_back(tid);
            seized.push_back(tid);
        }
        if (round == 0) stopping_began_ = Clock::now();
        for (pid_t tid : seized) ::ptrace(PTRACE_INTERRUPT, tid, nullptr, nullptr);
        wait_pending_stopped(Clock::now() + kStopTimeout);
        if (seized.empty()) break;
        if (round > 1000) throw Error("process " + std::to_string(pid_) + " keeps creating threads; try again");
    }
    if (threads_.empty() || !process_alive(pid_)) throw_gone();
    for (auto& thread : threads_)
        if (::ptrace(PTRACE_GETREGS, thread.tid, nullptr, &thread.regs) != 0) throw_gone();
}

// PTRACE_SEIZE of `tid` said EPERM.  The kernel says so for a thread it
// already traces for us: a clone made by a thread seized this round but not
// stopped yet, auto-attached before its parent's PTRACE_EVENT_CLONE was read
// (a JVM starting threads all the time).  That one stops by itself: wait for
// it.  It says so too for a thread that has exited (a zombie until reaped).
// Only a thread another tracer holds, or one we may not trace, is an error.
void StoppedProcess::seize_refused(pid_t tid) {
    const auto tracer = tracer_of(pid_, tid);
    // TracerPid names the tracing thread, this one (`iprobe run` attaches
    // to later loads from a thread of its own), which seized every thread.
    if (tracer && *tracer == std::to_string(::gettid())) {
        // Ours, stopped or exited: its report comes to next_report().
        pending_.push_back(tid);
        return;
    }
    const char state = proc::state(pid_, tid);
    if (!tracer || state == 0 || state == 'Z' || state == 'X') {
        if (tid == pid_) throw_gone();
        return;
    }
    if (*tracer != "0")
        throw Error("process " + std::to_string(pid_) + " is already traced by pid " + *tracer +
                        " (a debugger or another iprobe); detach it first",
                    ExitCode::busy);
    throw Error("not permitted to ptrace process " + std::to_string(pid_) +
                    ": run as root or as its owner (check /proc/sys/kernel/yama/ptrace_scope)",
                ExitCode::permission);
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

namespace {

// The kernel's x86-64 signal frame as rt_sigreturn reads it: the return
// address (pretcode), then struct ucontext with struct sigcontext inside
// (<asm/sigcontext.h>, <asm-generic/ucontext.h>; glibc's ucontext_t differs).
struct KernelSigcontext {
    std::uint64_t r8, r9, r10, r11, r12, r13, r14, r15, rdi, rsi, rbp, rbx, rdx, rax, rcx, rsp, rip, eflags;
    std::uint16_t cs, gs, fs, ss;
    std::uint64_t err, trapno, oldmask, cr2, fpstate;
    std::uint64_t reserved1[8];
};
struct KernelUcontext {
    std::uint64_t flags;
    std::uint64_t link;  // unused by rt_sigreturn: the landing keeps the call's result here
    std::uint64_t stack_sp;
    std::int32_t stack_flags, pad;
    std::uint64_t stack_size;
    KernelSigcontext mcontext;
    std::uint64_t sigmask;
};
static_assert(sizeof(KernelSigcontext) == 256 && sizeof(KernelUcontext) == 304 &&
              offsetof(KernelUcontext, mcontext) == 40 && offsetof(KernelUcontext, link) == 8);
constexpr std::uint64_t kUcFpXstate = 1, kUcSigcontextSs = 2;
constexpr std::uint32_t kFpXstateMagic1 = 0x46505853, kFpXstateMagic2 = 0x46505845;
constexpr std::size_t kFxsaveSize = 512, kSwReservedAt = 464;
constexpr unsigned kTileData = 18;  // XFEATURE_XTILE_DATA
// An invalid mode: rt_sigreturn's restore of the alternate signal stack
// fails (EINVAL, ignored by the kernel) and leaves the thread's own as it is.
constexpr std::int32_t kKeepAltstack = 3;

// The registers a thread stopped by PTRACE_INTERRUPT goes back to user mode
// with: a system call it was interrupted in is restarted (rt_sigreturn
// restarts nothing, so the frame must hold the restart already).
user_regs_struct as_resumed(user_regs_struct r) {
    if (static_cast<std::int64_t>(r.orig_rax) >= 0) {
        const auto rv = static_cast<std::int64_t>(r.rax);
        if (rv == -512 || rv == -513 || rv == -514) {  // ERESTARTSYS, ERESTARTNOINTR, ERESTARTNOHAND
            r.rax = r.orig_rax;
            r.rip -= 2;
        } else if (rv == -516) {  // ERESTART_RESTARTBLOCK
            r.rax = SYS_restart_syscall;
            r.rip -= 2;
        }
    }
    r.orig_rax = static_cast<unsigned long long>(-1);
    return r;
}

// The thread's FPU, SSE and AVX state as a signal frame holds it (XSAVE
// standard format with its software-reserved words and the closing magic),
// or the legacy FXSAVE image (restored as such) where XSAVE is unknown.
struct VectorState {
    std::vector<std::uint8_t> frame;   // written to the target, 64-byte aligned there
    std::vector<std::uint8_t> regset;  // NT_X86_XSTATE as read, to set it back
    bool xsave = false;
};

VectorState vector_state(pid_t tid) {
    VectorState v;
    std::vector<std::uint8_t> buf(64 * 1024);
    iovec iov{buf.data(), buf.size()};
    if (::ptrace(PTRACE_GETREGSET, tid, reinterpret_cast<void*>(NT_X86_XSTATE), &iov) == 0 && iov.iov_len > kFxsaveSize &&
        iov.iov_len + 4 <= buf.size()) {
        // The regset is the XSAVE standard format with XCR0 in its first
        // software-reserved word (as gdb reads it).  A signal frame's
        // software words say which of it rt_sigreturn restores: the
        // features of XCR0 but AMX tile data (enabled per process, never
        // in the default state), up to the end of the last one.
        std::uint64_t xcr0 = 0;
        std::memcpy(&xcr0, buf.data() + kSwReservedAt, 8);
        const std::uint64_t features = xcr0 & ~(1ull << kTileData);
        std::uint32_t xstate_size = kFxsaveSize + 64;
        for (unsigned i = 2; i < 63; i++)
            if (features >> i & 1) {
                unsigned size = 0, offset = 0, ecx = 0, edx = 0;
                __cpuid_count(0xd, i, size, offset, ecx, edx);
                xstate_size = std::max(xstate_size, offset + size);
            }
        if (xstate_size <= iov.iov_len) {
            std::uint64_t header_features = 0;
            std::memcpy(&header_features, buf.data() + kFxsaveSize, 8);
            header_features &= features;
            std::memcpy(buf.data() + kFxsaveSize, &header_features, 8);
            const std::uint32_t sw[5] = {kFpXstateMagic1, xstate_size + 4, static_cast<std::uint32_t>(features),
                                         static_cast<std::uint32_t>(features >> 32), xstate_size};
            buf.resize(iov.iov_len);
            v.regset = buf;
            std::memcpy(buf.data() + kSwReservedAt, sw, sizeof sw);
            buf.resize(xstate_size + 4);
            std::memcpy(buf.data() + xstate_size, &kFpXstateMagic2, 4);
            v.frame = std::move(buf);
            v.xsave = true;
            return v;
        }
    }
    v.frame.assign(kFxsaveSize, 0);
    if (::ptrace(PTRACE_GETFPREGS, tid, nullptr, v.frame.data()) != 0) throw Error("cannot read the FPU state of thread " + std::to_string(tid));
    std::fill(v.frame.begin() + kSwReservedAt, v.frame.end(), 0);  // no magic: FXSAVE only
    return v;
}

void set_vector_state(pid_t tid, const VectorState& v) {
    if (v.xsave) {
        std::vector<std::uint8_t> buf = v.regset;
        iovec iov{buf.data(), buf.size()};
        ::ptrace(PTRACE_SETREGSET, tid, reinterpret_cast<void*>(NT_X86_XSTATE), &iov);
    } else {
        ::ptrace(PTRACE_SETFPREGS, tid, nullptr, const_cast<std::uint8_t*>(v.frame.data()));
    }
}

bool is_syscall_stop(int status) { return WIFSTOPPED(status) && WSTOPSIG(status) == (SIGTRAP | 0x80); }

}  // namespace

std::uint64_t StoppedProcess::call(std::uint64_t function, std::vector<std::uint64_t> args,
                                   const std::string* string_arg, std::chrono::milliseconds timeout) {
    throw_if_interrupted();
    const std::uint64_t landing = landing_.with_result ? landing_.with_result : landing_.sigreturn;
    if (!landing) throw Error("no return landing in process " + std::to_string(pid_) + " (libc's signal return code not found)",
                              ExitCode::unavailable);
    StoppedThread& chosen = call_thread();
    const pid_t tid = chosen.tid;
    auto thread = [&]() -> StoppedThread& {
        for (auto& t : threads_)
            if (t.tid == tid) return t;
        throw_gone();
    };
    user_regs_struct saved{};
    std::uint64_t sigmask = 0;
    if (::ptrace(PTRACE_GETREGS, tid, nullptr, &saved) != 0 ||
        ::ptrace(PTRACE_GETSIGMASK, tid, reinterpret_cast<void*>(sizeof sigmask), &sigmask) != 0)
        throw_gone();
    const VectorState vectors = vector_state(tid);

    // Below the red zone, from the top: the string argument, the vector
    // state (64-byte aligned), the ucontext, the return address (the
    // landing), where the call's own stack begins.
    const std::uint64_t top = saved.rsp - 128 - 256;
    std::uint64_t at = top;
    std::uint64_t string_at = 0;
    if (string_arg) {
        at = (at - string_arg->size() - 1) & ~std::uint64_t{15};
        string_at = at;
    }
    const std::uint64_t vectors_at = (at - vectors.frame.size()) & ~std::uint64_t{63};
    const std::uint64_t context_at = (vectors_at - sizeof(KernelUcontext)) & ~std::uint64_t{15};
    const std::uint64_t sp = context_at - 8;  // 16-byte aligned + 8 at the function's entry, as after a call

    const user_regs_struct back = as_resumed(saved);
    KernelUcontext uc{};
    uc.flags = kUcSigcontextSs | (vectors.xsave ? kUcFpXstate : 0);
    uc.stack_flags = kKeepAltstack;
    KernelSigcontext& mc = uc.mcontext;
    mc = {back.r8, back.r9, back.r10, back.r11, back.r12, back.r13, back.r14, back.r15, back.rdi, back.rsi, back.rbp,
          back.rbx, back.rdx, back.rax, back.rcx, back.rsp, back.rip, back.eflags,
          static_cast<std::uint16_t>(back.cs), 0, 0, static_cast<std::uint16_t>(back.ss), 0, 0, 0, 0, vectors_at, {}};
    uc.sigmask = sigmask;

    std::vector<std::uint8_t> frame(top - sp, 0);
    std::memcpy(frame.data(), &landing, 8);
    std::memcpy(frame.data() + (context_at - sp), &uc, sizeof uc);
    std::memcpy(frame.data() + (vectors_at - sp), vectors.frame.data(), vectors.frame.size());
    if (string_arg) std::memcpy(frame.data() + (string_at - sp), string_arg->c_str(), string_arg->size() + 1);
    write(sp, frame.data(), frame.size());

    user_regs_struct regs = saved;
    if (string_arg) args.insert(args.begin(), string_at);
    regs.rsp = sp;
    regs.rip = function;
    regs.rax = 0;
    // No syscall restart on the way in: the thread may sit in an interrupted syscall.
    regs.orig_rax = static_cast<unsigned long long>(-1);
    unsigned long long* arg_regs[] = {&regs.rdi, &regs.rsi, &regs.rdx, &regs.rcx, &regs.r8, &regs.r9};
    for (std::size_t i = 0; i < args.size() && i < 6; i++) *arg_regs[i] = args[i];

    // While a tracer lives the thread is taken back at rt_sigreturn's exit;
    // the restore below is for a call abandoned (timeout) or crashed.
    auto restore = [&] {
        ::ptrace(PTRACE_SETREGS, tid, nullptr, &saved);
        set_vector_state(tid, vectors);
    };
    // From here on the thread may run on its own: the frame is in place.
    if (::ptrace(PTRACE_SETREGS, tid, nullptr, &regs) != 0) throw_gone();
    if (::ptrace(PTRACE_SYSCALL, tid, nullptr, nullptr) != 0) throw_gone();

    // Not interruptible: stopping a thread inside dlopen would leave the
    // loader's lock held.  The call is bounded by `timeout` instead.
    const auto deadline = Clock::now() + timeout;
    failed_syscall_ = {-1, 0};
    long syscall_nr = -1;
    bool returning = false;  // at rt_sigreturn's entry from our frame
    std::uint64_t last_result = 0;
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
        if (is_syscall_stop(status)) {
            __ptrace_syscall_info info{};
            if (::ptrace(PTRACE_GET_SYSCALL_INFO, tid, reinterpret_cast<void*>(sizeof info), &info) <= 0) throw_gone();
            if (info.op == PTRACE_SYSCALL_INFO_ENTRY) {
                syscall_nr = static_cast<long>(info.entry.nr);
                returning = info.entry.nr == SYS_rt_sigreturn && info.stack_pointer == context_at;
            } else if (info.op == PTRACE_SYSCALL_INFO_EXIT) {
                if (returning) {
                    // Back in its own context, stopped: what it resumes with on detach.
                    std::uint64_t result = last_result;
                    if (landing == landing_.with_result) read(context_at + offsetof(KernelUcontext, link), &result, 8);
                    ::ptrace(PTRACE_GETREGS, tid, nullptr, &thread().regs);
                    wait_pending_stopped(Clock::now() + kStopTimeout);
                    return result;
                }
                last_result = static_cast<std::uint64_t>(info.exit.rval);
                if (info.exit.is_error && failed_syscall_.second == 0)
                    failed_syscall_ = {syscall_nr, static_cast<int>(-info.exit.rval)};
            }
            if (::ptrace(PTRACE_SYSCALL, tid, nullptr, nullptr) != 0) throw_gone();
            continue;
        }
        const int event = event_of(status);
        const int sig = WSTOPSIG(status);
        if (event == 0 && (sig == SIGSEGV || sig == SIGBUS || sig == SIGILL || sig == SIGFPE)) {
            restore();
            throw Error("a function call inside process " + std::to_string(pid_) + " crashed (" + strsignal(sig) +
                        "); registers restored");
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
        if (::ptrace(PTRACE_SYSCALL, tid, nullptr, nullptr) != 0) throw_gone();
    }
}

}  // namespace iprobe::hotpatch
