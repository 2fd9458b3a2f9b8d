// What a process's seccomp filters would do with the system calls an attach
// makes in it: loading the runtime (the dynamic loader's), creating and
// mapping its region, mapping stub areas, and what the runtime's handlers
// call in every probed thread.  A service confined by a filter (systemd's
// SystemCallFilter=, a sandbox) is killed by a call its filter refuses
// (SIGSYS), or left half-attached by one that fails: the attach finds out
// before it calls anything, and refuses, changing nothing.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <linux/filter.h>

namespace iprobe::hotpatch {

// One system call as an attach makes it: its arguments where a filter may
// look at them (flags, protections), 0 for pointers and descriptors.
struct PlannedSyscall {
    const char* name;
    int nr;
    std::uint64_t args[6];
};

// Every call an attach (and then the runtime) makes in the target.
std::span<const PlannedSyscall> attach_syscalls();

// A filter's answer for one call (SECCOMP_RET_ACTION_FULL bits and data).
std::uint32_t run_filter(std::span<const sock_filter> filter, const PlannedSyscall& call);

// What the process's filters (read from `tid`, stopped under ptrace) do
// with the first call of attach_syscalls() they do not allow, said for
// people ("kill the process on memfd_create"); nullopt when every call is
// allowed, or the thread has no filter.
std::optional<std::string> seccomp_refusal(pid_t tid);

// The process's seccomp mode from /proc/PID/status: 0 none, 1 strict,
// 2 filter.
int seccomp_mode(pid_t pid);

class StoppedProcess;
// Throws Error(unavailable) when a filter of any of the stopped process's
// threads refuses a call of attach_syscalls() (or it is in strict mode):
// called before the first call made in the target.
void refuse_if_seccomp_forbids(const StoppedProcess& process);

}  // namespace iprobe::hotpatch
