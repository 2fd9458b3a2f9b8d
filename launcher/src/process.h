// Running the external tools the launcher drives (criu, ip, cp, mirror, ...).
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace iprobe::launcher {

struct RunResult {
    int exit_code = -1;  // -1 when killed by a signal or not started
    std::string out;
    std::string err;
    bool ok() const { return exit_code == 0; }
};

// Runs argv (no shell) in a process group of its own and waits; `in_child`
// runs after fork, before exec (e.g. to enter a namespace); it must only make
// async-signal-safe calls.
// `fd3`, when given, is the child's file descriptor 3 (a socket handed over).
RunResult run(const std::vector<std::string>& argv, const std::function<bool()>& in_child = {}, int fd3 = -1);

// Like run(), throwing Error(failure) with `what` and stderr on non-zero exit.
std::string run_checked(const std::vector<std::string>& argv, const std::string& what);

// Starts argv in the background with stdout/stderr to the given fds (-1:
// /dev/null) and returns its PID.  It gets SIGTERM if the caller dies.
// With `own_group` it leads a new process group, so that signalling -PID
// reaches helpers it forks (nsenter --pid runs the tool as its child).
// `from_fd3` become the child's descriptors 3, 4, ... (a readiness pipe, a
// control socket); `stdin_fd` its stdin (-1: /dev/null).
pid_t spawn(const std::vector<std::string>& argv, int stdout_fd = -1, int stderr_fd = -1, bool own_group = false,
            const std::vector<int>& from_fd3 = {}, int stdin_fd = -1);

// One line from `fd`, without its newline, waited for at most `timeout`
// (a peer that answers one line per question: the mirror's readiness and
// command replies, the probe-cost target).  nullopt when the writer closed
// first; Error(failure) "`what` did not answer within N s" on timeout.
std::optional<std::string> read_line(int fd, std::chrono::milliseconds timeout, const std::string& what);

// While one lives, SIGINT, SIGTERM and SIGHUP do not end the launcher: they
// mark it interrupted, and it undoes what it half made (a clone, its
// namespace, its images) before it exits with ExitCode::interrupted.  The
// tools run() starts lead process groups of their own, so a terminal's
// Ctrl-C never cuts CRIU off with production frozen.  Blocking waits return
// early (EINTR) to look.
class InterruptGuard {
public:
    InterruptGuard();
    ~InterruptGuard();
    InterruptGuard(const InterruptGuard&) = delete;
    InterruptGuard& operator=(const InterruptGuard&) = delete;

private:
    std::array<struct sigaction, 3> saved_{};  // SIGINT, SIGTERM, SIGHUP as they were
};
bool interrupted() noexcept;
// Error(interrupted) saying that `undone` was undone, when interrupted().
void throw_if_interrupted(const std::string& undone);

// What a helper writes on the guardian's pipe (clone_guardian.h), whose
// records are a kind, a payload length and the payload.
struct ChildNote {
    static constexpr std::uint32_t kKind = 1;
    std::uint32_t kind = kKind;
    std::uint32_t length = sizeof(std::int32_t);
    std::int32_t pid = 0;
};

// While `fd` >= 0, every helper process the launcher starts (run(),
// criu swrk, the keeper's first fork) writes its own PID to `fd`, from the
// child, before it execs: a ChildNote record (clone_guardian.h).  Written by
// the child, the note cannot be lost to a launcher killed right after the
// fork.  -1 (the default) turns it off; a forked child that does not exec
// (the guardian, the keeper) must turn it off for its own children.
void note_children_to(int fd);
// Called in a freshly forked child: notes its PID, async-signal-safe.
void note_this_child() noexcept;

// In a forked child, async-signal-safe: signals as a fresh process has them
// (none blocked; SIGPIPE, SIGINT and SIGTERM at their defaults).
void reset_signals() noexcept;
// In a forked child, async-signal-safe: stdin, stdout and stderr on /dev/null.
void stdio_to_dev_null() noexcept;

// Test-only (tests/launcher): with IPROBE_TEST_PAUSE=STEP in the environment,
// the launcher reaching `step` says "iprobe: test pause at STEP (PID N)" on
// stderr and stops itself (SIGSTOP), so that a test can kill it (SIGKILL)
// there exactly.  Steps: docs/debug-container.md ("Interrupted, it undoes
// itself"; for --container, "Killed or interrupted, a container clone leaves
// nothing").  Without the variable it does nothing.
void test_pause(const char* step);
bool test_pause_armed(const char* step);

// Whether `path` names an executable file; searches PATH when it has no '/'.
std::string find_program(const std::string& name);

// Milliseconds on a monotonic clock.
double now_ms();

}  // namespace iprobe::launcher
