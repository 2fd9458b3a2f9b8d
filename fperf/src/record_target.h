// The process being profiled: started stopped with the handler preloaded, or
// an existing one; where its modules are loaded and how much CPU it used.
#pragma once

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "iprobe/support/proc.h"

namespace iprobe::fperf {

// The file-backed mappings of /proc/PID/maps; empty once the process is gone.
std::vector<proc::Mapping> file_mappings(pid_t pid);

std::string exe_of(pid_t pid);

// Load bias of `path` in `pid`, from /proc/PID/maps and the ELF headers.
std::optional<std::uint64_t> load_bias(pid_t pid, const std::string& path);

bool handler_mapped(pid_t pid, const std::string& handler);

// A process we watch: our child (start mode) or anyone's (attach mode).
class Target {
public:
    Target(pid_t pid, bool child) : pid_(pid), child_(child) {}
    pid_t pid() const { return pid_; }
    bool is_child() const { return child_; }
    bool exited() const { return exited_; }
    int exit_status() const { return status_; }

    bool alive() {
        if (exited_) return false;
        if (child_) {
            int status = 0;
            const pid_t r = ::waitpid(pid_, &status, WNOHANG);
            if (r == pid_ && (WIFEXITED(status) || WIFSIGNALED(status))) {
                exited_ = true;
                status_ = status;
            }
            return !exited_;
        }
        if (::kill(pid_, 0) != 0 && errno == ESRCH) {
            exited_ = true;
            return false;
        }
        const char state = proc::state(pid_);
        if (state == 0 || state == 'Z' || state == 'X') {
            exited_ = true;
            return false;
        }
        return true;
    }

    // Blocks until the child exits (start mode, after recording stopped).
    void wait_exit() {
        if (!child_ || exited_) return;
        int status = 0;
        while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
        }
        exited_ = true;
        status_ = status;
    }

private:
    pid_t pid_;
    bool child_;
    bool exited_ = false;
    int status_ = 0;
};

std::string describe_status(int status);

// Forks the program with the handler preloaded; the child waits on `go`
// until the shared memory for its pid exists, then execs; the handler stops
// it with SIGSTOP once attached, so functions can be registered and probes
// routed before main() runs.
pid_t spawn_stopped_later(const std::vector<std::string>& command, const std::string& handler, int& go_fd);

// What all the target's threads ran (schedstat): CPU time in ns (unlike
// /proc/PID/stat's ticks) and how many times they were switched in.
struct TargetRun {
    std::uint64_t cpu_ns = 0;
    std::uint64_t switches = 0;
};
std::optional<TargetRun> target_run(pid_t pid);

}  // namespace iprobe::fperf
