// Holding a target still: one session per target, the world stopped (and
// retried at a safe point) at a priority nothing preempts, and who the target
// is.
#pragma once

#include <sched.h>
#include <sys/resource.h>
#include <sys/types.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

#include "iprobe/support/error.h"
#include "iprobe/support/lock_file.h"
#include "process.h"

namespace iprobe::hotpatch {

using Clock = std::chrono::steady_clock;

// A thread was at a site about to change (or in code that must not be
// interrupted): let the target run briefly and try again.
struct RetryLater {};

inline constexpr std::uint64_t kPage = 4096;

std::string basename_of(const std::string& path);

std::string canonical_or_same(const std::string& path);

// One attach or detach per target at a time: the second gets ExitCode::busy.
class SessionLock {
public:
    explicit SessionLock(pid_t pid)
        : lock_(std::to_string(pid) + ".lock", "another iprobe session is attaching to or detaching from process " +
                                                   std::to_string(pid) + "; wait for it to finish and retry") {}

private:
    LockFile lock_;
};

std::uint64_t elapsed_us(Clock::time_point since);

struct Target {
    uid_t uid = 0;
    gid_t gid = 0;
};

Target target_owner(pid_t pid);

// The pid the target sees for itself (differs inside a PID namespace).
pid_t pid_in_own_namespace(pid_t pid);

// Runs `body` with the world stopped; a body that throws RetryLater (an
// unsafe moment) is run again after letting the target go briefly.
// While the target is stopped, this process is the only one making progress
// for it, and once it lets the first thread go, that thread must not take the
// CPU from the detaching of the others: run as a real-time task for the
// duration (root only; SCHED_FIFO at the lowest priority outranks every normal
// task, and the kernel's RT throttling still bounds it), else at nice -20.
class UrgentPriority {
public:
    UrgentPriority() {
        saved_policy_ = ::sched_getscheduler(0);
        ::sched_getparam(0, &saved_param_);
        const sched_param rt{1};
        realtime_ = saved_policy_ == SCHED_OTHER && ::sched_setscheduler(0, SCHED_FIFO, &rt) == 0;
        if (realtime_) return;
        errno = 0;
        saved_nice_ = ::getpriority(PRIO_PROCESS, 0);
        niced_ = errno == 0 && ::setpriority(PRIO_PROCESS, 0, -20) == 0;
    }
    ~UrgentPriority() {
        if (realtime_) ::sched_setscheduler(0, saved_policy_, &saved_param_);
        if (niced_) ::setpriority(PRIO_PROCESS, 0, saved_nice_);
    }
    UrgentPriority(const UrgentPriority&) = delete;
    UrgentPriority& operator=(const UrgentPriority&) = delete;

private:
    int saved_policy_ = SCHED_OTHER;
    sched_param saved_param_{};
    int saved_nice_ = 0;
    bool realtime_ = false, niced_ = false;
};

template <typename Body>
auto with_world_stopped(pid_t pid, std::chrono::milliseconds timeout, Body&& body) {
    UrgentPriority urgent;
    const auto deadline = Clock::now() + timeout;
    for (int attempt = 0;; attempt++) {
        throw_if_interrupted();
        {
            StoppedProcess process(pid);
            // The pause the target feels: from the first interrupt (seizing
            // stops nothing), not from our checks of the pid before it.
            const auto started = process.stopping_began();
            process.stop_us = elapsed_us(started);
            try {
                return body(process, started, deadline);
            } catch (const RetryLater&) {
            }
        }
        if (Clock::now() > deadline)
            throw Error("process " + std::to_string(pid) + " never reached a safe point within " +
                            std::to_string(timeout.count()) + " ms (a thread kept executing a site being patched); retry",
                        ExitCode::busy);
        std::this_thread::sleep_for(std::chrono::microseconds(500 + 200 * (attempt % 10)));
    }
}

}  // namespace iprobe::hotpatch
