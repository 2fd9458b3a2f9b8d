#include "process.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "iprobe/support/error.h"

namespace iprobe::hotpatch {

namespace {

std::string proc_path(pid_t pid, const char* leaf) { return "/proc/" + std::to_string(pid) + "/" + leaf; }

// Third field of /proc/PID/task/TID/stat.
char thread_state(pid_t pid, pid_t tid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/task/" + std::to_string(tid) + "/stat");
    std::string line;
    if (!std::getline(in, line)) return 0;
    const auto paren = line.rfind(')');
    return paren == std::string::npos || paren + 2 >= line.size() ? 0 : line[paren + 2];
}

std::string tracer_of(pid_t pid) {
    std::ifstream in(proc_path(pid, "status"));
    std::string line;
    while (std::getline(in, line))
        if (line.rfind("TracerPid:", 0) == 0) {
            std::string v = line.substr(10);
            v.erase(0, v.find_first_not_of(" \t"));
            return v;
        }
    return "0";
}

[[noreturn]] void throw_gone(pid_t pid) {
    throw Error("process " + std::to_string(pid) + " exited while iprobe was attaching; nothing was left changed",
                ExitCode::failure);
}

}  // namespace

std::vector<Mapping> read_maps(pid_t pid) {
    std::ifstream in(proc_path(pid, "maps"));
    if (!in) throw Error("cannot read /proc/" + std::to_string(pid) + "/maps", ExitCode::not_found);
    std::vector<Mapping> maps;
    std::string line;
    while (std::getline(in, line)) {
        Mapping m;
        std::istringstream fields(line);
        std::string range, dev, inode;
        fields >> range >> m.perms >> std::hex >> m.offset >> dev >> inode;
        const auto dash = range.find('-');
        m.start = std::stoull(range.substr(0, dash), nullptr, 16);
        m.end = std::stoull(range.substr(dash + 1), nullptr, 16);
        std::getline(fields, m.path);
        m.path.erase(0, m.path.find_first_not_of(' '));
        maps.push_back(std::move(m));
    }
    return maps;
}

std::vector<pid_t> list_threads(pid_t pid) {
    std::vector<pid_t> tids;
    DIR* dir = ::opendir(proc_path(pid, "task").c_str());
    if (!dir) return tids;
    while (const dirent* entry = ::readdir(dir))
        if (entry->d_name[0] != '.') tids.push_back(static_cast<pid_t>(std::atoi(entry->d_name)));
    ::closedir(dir);
    std::sort(tids.begin(), tids.end());
    return tids;
}

bool process_exists(pid_t pid) { return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM); }

void check_target(pid_t pid) {
    if (pid <= 0) throw Error("invalid pid " + std::to_string(pid), ExitCode::usage);
    if (::kill(pid, 0) != 0 && errno == ESRCH)
        throw Error("no such process: " + std::to_string(pid), ExitCode::not_found);
    if (pid == ::getpid()) throw Error("iprobe cannot attach to itself", ExitCode::usage);
    const char state = thread_state(pid, pid);
    if (state == 'Z' || state == 'X') throw Error("process " + std::to_string(pid) + " is a zombie", ExitCode::not_found);
    // The kernel's ptrace access check guards /proc/PID/mem: ask it early.
    UniqueFd mem(::open(proc_path(pid, "mem").c_str(), O_RDONLY | O_CLOEXEC));
    if (!mem && (errno == EACCES || errno == EPERM))
        throw Error("not permitted to ptrace process " + std::to_string(pid) +
                        ": run as root or as its owner (check /proc/sys/kernel/yama/ptrace_scope)",
                    ExitCode::permission);
}

StoppedProcess::StoppedProcess(pid_t pid) : pid_(pid) {
    check_target(pid);
    try {
        seize_all();
    } catch (...) {
        release();
        throw;
    }
    try {
        memory_ = ProcessMemory(pid);
    } catch (...) {
        release();
        throw;
    }
}

StoppedProcess::~StoppedProcess() { release(); }

void StoppedProcess::seize_all() {
    constexpr long options = PTRACE_O_TRACECLONE;
    // Threads may be created while we stop the others: repeat until the
    // task list holds nothing we have not stopped (new clones of stopped
    // threads are auto-attached and show up as PTRACE_EVENT_CLONE).
    for (int round = 0;; round++) {
        bool added = false;
        for (pid_t tid : list_threads(pid_)) {
            const bool known = std::any_of(threads_.begin(), threads_.end(),
                                           [&](const StoppedThread& t) { return t.tid == tid; }) ||
                               std::find(new_threads_.begin(), new_threads_.end(), tid) != new_threads_.end();
            if (known) continue;
            const char state = thread_state(pid_, tid);
            if (state == 'Z' || state == 'X' || state == 0) continue;
            if (::ptrace(PTRACE_SEIZE, tid, nullptr, reinterpret_cast<void*>(options)) != 0) {
                if (errno == ESRCH) continue;  // exited meanwhile
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
            ::ptrace(PTRACE_INTERRUPT, tid, nullptr, nullptr);
            new_threads_.push_back(tid);
            added = true;
        }
        while (!new_threads_.empty()) {
            StoppedThread thread;
            thread.tid = new_threads_.back();
            new_threads_.pop_back();
            if (wait_stopped(thread)) threads_.push_back(thread);
        }
        if (!added) break;
        if (round > 1000) throw Error("process " + std::to_string(pid_) + " keeps creating threads; try again");
    }
    if (threads_.empty() || !process_exists(pid_)) throw_gone(pid_);
    for (auto& thread : threads_)
        if (::ptrace(PTRACE_GETREGS, thread.tid, nullptr, &thread.regs) != 0) throw_gone(pid_);
}

// Waits for `thread` to reach a ptrace stop; false when it exited.
bool StoppedProcess::wait_stopped(StoppedThread& thread) {
    for (;;) {
        int status = 0;
        const pid_t r = ::waitpid(thread.tid, &status, __WALL);
        if (r < 0) {
            if (errno == EINTR) continue;
            return false;
        }
        if (WIFEXITED(status) || WIFSIGNALED(status)) return false;
        if (!WIFSTOPPED(status)) continue;
        const int event = static_cast<unsigned>(status) >> 16;
        const int sig = WSTOPSIG(status);
        if (event == PTRACE_EVENT_STOP) return true;
        if (event == PTRACE_EVENT_CLONE) {
            unsigned long child = 0;
            if (::ptrace(PTRACE_GETEVENTMSG, thread.tid, nullptr, &child) == 0)
                new_threads_.push_back(static_cast<pid_t>(child));
        } else if (event == 0) {
            // A signal arrived first: keep the thread stopped here and hand
            // the signal back when it is resumed.
            thread.pending_signal = sig;
            return true;
        }
        // Any other event stop: let it go on to our interrupt.
        ::ptrace(PTRACE_CONT, thread.tid, nullptr, nullptr);
        ::ptrace(PTRACE_INTERRUPT, thread.tid, nullptr, nullptr);
    }
}

void StoppedProcess::release() {
    if (released_) return;
    released_ = true;
    for (auto& thread : threads_)
        ::ptrace(PTRACE_DETACH, thread.tid, nullptr, reinterpret_cast<void*>(static_cast<long>(thread.pending_signal)));
    // Threads auto-attached but never waited for (an exception mid-way).
    for (pid_t tid : new_threads_) {
        StoppedThread t;
        t.tid = tid;
        if (wait_stopped(t)) ::ptrace(PTRACE_DETACH, tid, nullptr, reinterpret_cast<void*>(static_cast<long>(t.pending_signal)));
    }
    new_threads_.clear();
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
            if (!process_exists(pid_)) throw_gone(pid_);
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
            if (!process_exists(pid_)) throw_gone(pid_);
            std::ostringstream s;
            s << "cannot write target memory at 0x" << std::hex << address << ": " << std::strerror(errno);
            throw Error(s.str());
        }
        p += n, address += static_cast<std::uint64_t>(n), size -= static_cast<std::size_t>(n);
    }
}

void StoppedProcess::absorb_new_threads() {
    while (!new_threads_.empty()) {
        StoppedThread thread;
        thread.tid = new_threads_.back();
        new_threads_.pop_back();
        if (wait_stopped(thread) && ::ptrace(PTRACE_GETREGS, thread.tid, nullptr, &thread.regs) == 0)
            threads_.push_back(thread);
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
    StoppedThread& thread = call_thread();
    user_regs_struct saved{};
    user_fpregs_struct saved_fp{};
    if (::ptrace(PTRACE_GETREGS, thread.tid, nullptr, &saved) != 0 ||
        ::ptrace(PTRACE_GETFPREGS, thread.tid, nullptr, &saved_fp) != 0)
        throw_gone(pid_);

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
        ::ptrace(PTRACE_SETREGS, thread.tid, nullptr, &saved);
        ::ptrace(PTRACE_SETFPREGS, thread.tid, nullptr, &saved_fp);
    };
    if (::ptrace(PTRACE_SETREGS, thread.tid, nullptr, &regs) != 0) throw_gone(pid_);
    if (::ptrace(PTRACE_CONT, thread.tid, nullptr, nullptr) != 0) throw_gone(pid_);

    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
        int status = 0;
        const pid_t r = ::waitpid(thread.tid, &status, __WALL | WNOHANG);
        if (r < 0 && errno != EINTR) throw_gone(pid_);
        if (r == 0) {
            if (std::chrono::steady_clock::now() > deadline) {
                // Stuck (a lock held by a stopped thread?): take the thread
                // back; its call is abandoned, the process keeps running.
                ::ptrace(PTRACE_INTERRUPT, thread.tid, nullptr, nullptr);
                StoppedThread again = thread;
                if (wait_stopped(again)) restore();
                throw Error("a function call inside process " + std::to_string(pid_) + " did not return within " +
                            std::to_string(timeout.count()) + " ms; the process may be holding a lock; try again");
            }
            std::this_thread::sleep_for(std::chrono::microseconds(50));
            continue;
        }
        if (r <= 0) continue;
        if (WIFEXITED(status) || WIFSIGNALED(status)) throw_gone(pid_);
        if (!WIFSTOPPED(status)) continue;
        const int event = static_cast<unsigned>(status) >> 16;
        const int sig = WSTOPSIG(status);
        if (event == 0 && sig == SIGSEGV) {
            user_regs_struct after{};
            ::ptrace(PTRACE_GETREGS, thread.tid, nullptr, &after);
            if (after.rip == trap_return) {
                restore();
                absorb_new_threads();
                return after.rax;
            }
            restore();
            throw Error("a function call inside process " + std::to_string(pid_) +
                        " crashed (SIGSEGV); registers restored");
        }
        if (event == PTRACE_EVENT_CLONE) {
            unsigned long child = 0;
            if (::ptrace(PTRACE_GETEVENTMSG, thread.tid, nullptr, &child) == 0)
                new_threads_.push_back(static_cast<pid_t>(child));
            ::ptrace(PTRACE_CONT, thread.tid, nullptr, nullptr);
            continue;
        }
        if (event == 0 && thread.pending_signal == 0) thread.pending_signal = sig;  // deliver later
        ::ptrace(PTRACE_CONT, thread.tid, nullptr, nullptr);
    }
}

}  // namespace iprobe::hotpatch
