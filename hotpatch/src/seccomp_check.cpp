#include "seccomp_check.h"

#include <fcntl.h>
#include <linux/audit.h>
#include <linux/futex.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "iprobe/support/error.h"
#include "process.h"

#ifndef PTRACE_SECCOMP_GET_FILTER
#define PTRACE_SECCOMP_GET_FILTER 0x420c
#endif

namespace iprobe::hotpatch {

namespace {

constexpr std::uint64_t kAtFdcwd = static_cast<std::uint64_t>(static_cast<std::int64_t>(AT_FDCWD));
constexpr std::uint64_t kNoFd = ~std::uint64_t{0};

// As glibc's dynamic loader makes them loading the runtime (glibc 2.36),
// then as the runtime and the attach's remote calls make them.
const PlannedSyscall kAttachSyscalls[] = {
    {"openat", SYS_openat, {kAtFdcwd, 0, O_RDONLY | O_CLOEXEC}},
    {"read", SYS_read, {}},
    {"pread64", SYS_pread64, {}},
    {"newfstatat", SYS_newfstatat, {0, 0, 0, AT_EMPTY_PATH}},
    {"fstat", SYS_fstat, {}},
    {"mmap", SYS_mmap, {0, 0, PROT_READ, MAP_PRIVATE | MAP_DENYWRITE}},
    {"mmap", SYS_mmap, {0, 0, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_FIXED | MAP_DENYWRITE}},
    {"mmap", SYS_mmap, {0, 0, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED | MAP_DENYWRITE}},
    {"mmap", SYS_mmap, {0, 0, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED | MAP_ANONYMOUS, kNoFd}},
    {"mprotect", SYS_mprotect, {0, 0, PROT_READ}},
    {"mprotect", SYS_mprotect, {0, 0, PROT_NONE}},
    {"munmap", SYS_munmap, {}},
    {"close", SYS_close, {}},
    // the region (iprobe_rt_create_region, iprobe_rt_map_region)
    {"getpid", SYS_getpid, {}},
    {"memfd_create", SYS_memfd_create, {0, MFD_CLOEXEC | MFD_ALLOW_SEALING}},
    {"ftruncate", SYS_ftruncate, {}},
    {"mmap", SYS_mmap, {0, 0, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE}},
    // stub areas near each module (map_stubs_near)
    {"mmap", SYS_mmap, {0, 0, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, kNoFd}},
    // what the handlers call in each probed thread (its first event's
    // claim, a lossless trace's wait, values read fault-safe)
    {"gettid", SYS_gettid, {}},
    {"rt_sigprocmask", SYS_rt_sigprocmask, {SIG_BLOCK, 0, 0, 8}},
    {"rt_sigprocmask", SYS_rt_sigprocmask, {SIG_SETMASK, 0, 0, 8}},
    {"madvise", SYS_madvise, {0, 0, MADV_POPULATE_WRITE}},
    {"futex", SYS_futex, {0, FUTEX_WAIT}},
    {"process_vm_readv", SYS_process_vm_readv, {0, 0, 1, 0, 1, 0}},
};

// The seccomp_data word at `offset`, as the kernel lays it out.
std::optional<std::uint32_t> data_word(const PlannedSyscall& call, std::uint32_t offset) {
    seccomp_data data{};
    data.nr = call.nr;
    data.arch = AUDIT_ARCH_X86_64;
    for (int i = 0; i < 6; i++) data.args[i] = call.args[i];
    if (offset % 4 != 0 || offset + 4 > sizeof data) return std::nullopt;
    std::uint32_t word;
    std::memcpy(&word, reinterpret_cast<const char*>(&data) + offset, 4);
    return word;
}

// How severe an action is: the kernel takes the most severe of all filters'.
int severity(std::uint32_t action) {
    switch (action & SECCOMP_RET_ACTION_FULL) {
    case SECCOMP_RET_KILL_PROCESS: return 7;
    case SECCOMP_RET_KILL_THREAD: return 6;
    case SECCOMP_RET_TRAP: return 5;
    case SECCOMP_RET_ERRNO: return 4;
    case SECCOMP_RET_USER_NOTIF: return 3;
    case SECCOMP_RET_TRACE: return 2;
    case SECCOMP_RET_LOG: return 1;
    case SECCOMP_RET_ALLOW: return 0;
    default: return 7;  // unknown: the kernel kills
    }
}

std::string said(std::uint32_t action) {
    switch (action & SECCOMP_RET_ACTION_FULL) {
    case SECCOMP_RET_KILL_PROCESS: return "kill the process";
    case SECCOMP_RET_KILL_THREAD: return "kill the thread";
    case SECCOMP_RET_TRAP: return "send it SIGSYS";
    case SECCOMP_RET_ERRNO: return "fail with " + std::string(std::strerror(static_cast<int>(action & SECCOMP_RET_DATA)));
    case SECCOMP_RET_USER_NOTIF: return "wait for its supervisor";
    case SECCOMP_RET_TRACE: return "stop for a seccomp tracer";
    default: return "kill the process";
    }
}

std::vector<std::vector<sock_filter>> filters_of(pid_t tid) {
    std::vector<std::vector<sock_filter>> filters;
    for (unsigned long index = 0;; index++) {
        errno = 0;
        const long count = ::ptrace(static_cast<__ptrace_request>(PTRACE_SECCOMP_GET_FILTER), tid, index, nullptr);
        if (count < 0) {
            if (errno == ENOENT) break;  // no filter at that depth: all read
            throw_errno("cannot read the seccomp filters of thread " + std::to_string(tid) +
                            " (PTRACE_SECCOMP_GET_FILTER needs CAP_SYS_ADMIN)",
                        errno == EACCES || errno == EPERM ? ExitCode::permission : ExitCode::failure);
        }
        std::vector<sock_filter> filter(static_cast<std::size_t>(count));
        if (::ptrace(static_cast<__ptrace_request>(PTRACE_SECCOMP_GET_FILTER), tid, index, filter.data()) != count)
            throw_errno("cannot read seccomp filter " + std::to_string(index) + " of thread " + std::to_string(tid));
        filters.push_back(std::move(filter));
    }
    return filters;
}

}  // namespace

std::span<const PlannedSyscall> attach_syscalls() { return kAttachSyscalls; }

// Classic BPF as seccomp runs it: A, X, 16 words of scratch memory, forward
// jumps only (the kernel checked the program when it was installed).
std::uint32_t run_filter(std::span<const sock_filter> filter, const PlannedSyscall& call) {
    std::uint32_t a = 0, x = 0, mem[BPF_MEMWORDS] = {};
    for (std::size_t pc = 0; pc < filter.size(); pc++) {
        const sock_filter& in = filter[pc];
        const std::uint32_t k = in.k;
        switch (BPF_CLASS(in.code)) {
        case BPF_LD:
            if (BPF_MODE(in.code) == BPF_ABS) {
                const auto word = data_word(call, k);
                if (!word) return SECCOMP_RET_KILL_PROCESS;
                a = *word;
            } else if (BPF_MODE(in.code) == BPF_IMM) {
                a = k;
            } else if (BPF_MODE(in.code) == BPF_MEM && k < BPF_MEMWORDS) {
                a = mem[k];
            } else if (BPF_MODE(in.code) == BPF_LEN) {
                a = sizeof(seccomp_data);
            } else {
                return SECCOMP_RET_KILL_PROCESS;
            }
            break;
        case BPF_LDX:
            if (BPF_MODE(in.code) == BPF_IMM) x = k;
            else if (BPF_MODE(in.code) == BPF_MEM && k < BPF_MEMWORDS) x = mem[k];
            else if (BPF_MODE(in.code) == BPF_LEN) x = sizeof(seccomp_data);
            else return SECCOMP_RET_KILL_PROCESS;
            break;
        case BPF_ST:
            if (k >= BPF_MEMWORDS) return SECCOMP_RET_KILL_PROCESS;
            mem[k] = a;
            break;
        case BPF_STX:
            if (k >= BPF_MEMWORDS) return SECCOMP_RET_KILL_PROCESS;
            mem[k] = x;
            break;
        case BPF_ALU: {
            const std::uint32_t operand = BPF_SRC(in.code) == BPF_X ? x : k;
            switch (BPF_OP(in.code)) {
            case BPF_ADD: a += operand; break;
            case BPF_SUB: a -= operand; break;
            case BPF_MUL: a *= operand; break;
            case BPF_DIV: if (operand == 0) return SECCOMP_RET_KILL_PROCESS; a /= operand; break;
            case BPF_MOD: if (operand == 0) return SECCOMP_RET_KILL_PROCESS; a %= operand; break;
            case BPF_AND: a &= operand; break;
            case BPF_OR: a |= operand; break;
            case BPF_XOR: a ^= operand; break;
            case BPF_LSH: a = operand < 32 ? a << operand : 0; break;
            case BPF_RSH: a = operand < 32 ? a >> operand : 0; break;
            case BPF_NEG: a = 0 - a; break;
            default: return SECCOMP_RET_KILL_PROCESS;
            }
            break;
        }
        case BPF_JMP: {
            if (BPF_OP(in.code) == BPF_JA) {
                pc += k;
                break;
            }
            const std::uint32_t operand = BPF_SRC(in.code) == BPF_X ? x : k;
            bool taken;
            switch (BPF_OP(in.code)) {
            case BPF_JEQ: taken = a == operand; break;
            case BPF_JGT: taken = a > operand; break;
            case BPF_JGE: taken = a >= operand; break;
            case BPF_JSET: taken = (a & operand) != 0; break;
            default: return SECCOMP_RET_KILL_PROCESS;
            }
            pc += taken ? in.jt : in.jf;
            break;
        }
        case BPF_RET: return BPF_RVAL(in.code) == BPF_A ? a : k;
        case BPF_MISC:
            if (BPF_MISCOP(in.code) == BPF_TAX) x = a;
            else a = x;
            break;
        default: return SECCOMP_RET_KILL_PROCESS;
        }
    }
    return SECCOMP_RET_KILL_PROCESS;  // ran off the end: never a valid filter
}

std::optional<std::string> seccomp_refusal(pid_t tid) {
    const std::vector<std::vector<sock_filter>> filters = filters_of(tid);
    if (filters.empty()) return std::nullopt;
    for (const PlannedSyscall& call : kAttachSyscalls) {
        std::uint32_t worst = SECCOMP_RET_ALLOW;
        for (const auto& filter : filters) {
            const std::uint32_t action = run_filter(filter, call);
            if (severity(action) > severity(worst)) worst = action;
        }
        if (severity(worst) > severity(SECCOMP_RET_LOG))
            return "its seccomp filter would " + said(worst) + " on " + call.name + ", which the attach makes in it";
    }
    return std::nullopt;
}

int seccomp_mode(pid_t pid) {
    std::ifstream status("/proc/" + std::to_string(pid) + "/status");
    std::string line;
    while (std::getline(status, line))
        if (line.rfind("Seccomp:", 0) == 0) return std::atoi(line.c_str() + 8);
    return 0;
}

// Before the first call made in the target: a call its seccomp filter
// refuses kills it (SIGSYS) or leaves it half-attached.  Strict mode allows
// nothing an attach needs.
void refuse_if_seccomp_forbids(const StoppedProcess& process) {
    const int mode = seccomp_mode(process.pid());
    if (mode == 0) return;
    const std::string who = "process " + std::to_string(process.pid());
    if (mode == 1)
        throw Error(who + " runs in strict seccomp mode (read, write, exit and sigreturn only): the runtime cannot be "
                          "loaded into it; nothing was changed",
                    ExitCode::unavailable);
    for (const StoppedThread& t : process.threads())
        if (auto why = seccomp_refusal(t.tid))
            throw Error(who + " cannot be attached: " + *why + " (thread " + std::to_string(t.tid) +
                            "); nothing was changed",
                        ExitCode::unavailable);
}

}  // namespace iprobe::hotpatch
