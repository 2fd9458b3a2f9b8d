// The process tree being cloned: its members, their sessions and terminals,
// and the clone's PIDs as seen from outside its PID namespace.
#include "clone_steps.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "iprobe/support/error.h"
#include "iprobe/support/proc.h"
#include "process.h"

namespace fs = std::filesystem;

namespace iprobe::launcher::clone_steps {

namespace {

std::vector<pid_t> children_of(pid_t pid) {
    std::vector<pid_t> out;
    for (pid_t tid : proc::threads(pid)) {
        std::ifstream in("/proc/" + std::to_string(pid) + "/task/" + std::to_string(tid) + "/children");
        pid_t child;
        while (in >> child) out.push_back(child);
    }
    return out;
}

// The session ID as the process itself sees it (the last NSsid field): 0
// when its session leader lives in an ancestor PID namespace.  -1: unknown.
pid_t session_seen_by(pid_t pid) {
    const auto levels = proc::status_numbers(pid, "NSsid");
    return levels.empty() ? -1 : static_cast<pid_t>(levels.back());
}

pid_t ns_pid(pid_t host_pid) {
    const auto levels = proc::status_numbers(host_pid, "NSpid");
    return levels.empty() ? -1 : static_cast<pid_t>(levels.back());
}

}  // namespace

std::string readlink_str(const std::string& path) {
    char buf[PATH_MAX];
    ssize_t n = ::readlink(path.c_str(), buf, sizeof buf - 1);
    if (n < 0) return {};
    return std::string(buf, static_cast<size_t>(n));
}

std::vector<pid_t> process_tree(pid_t root) {
    std::vector<pid_t> tree{root};
    for (size_t i = 0; i < tree.size(); ++i)
        for (pid_t c : children_of(tree[i])) tree.push_back(c);
    return tree;
}

std::string start_time(pid_t pid) { return proc::stat_field(pid, 22).value_or(""); }

pid_t session_of(pid_t pid) {
    pid_t sid = ::getsid(pid);
    return sid < 0 ? pid : sid;
}

void require_user_process(pid_t pid) {
    const char state = proc::state(pid);
    if (state == 0) throw Error("no process " + std::to_string(pid), ExitCode::not_found);
    if (state == 'Z' || state == 'X')
        throw Error("PID " + std::to_string(pid) + " is a zombie (it exited; its parent has not reaped it): there is "
                        "nothing to clone",
                    ExitCode::not_found);
    if (proc::kernel_thread(pid))
        throw Error("PID " + std::to_string(pid) + " (" + proc::stat_field(pid, 2).value_or("?") +
                        ") is a kernel thread: it has no user memory to clone",
                    ExitCode::bad_input);
}

void require_visible_session_leaders(const std::vector<pid_t>& tree) {
    for (pid_t pid : tree) {
        if (session_seen_by(pid) != 0) continue;
        throw Error("PID " + std::to_string(pid) +
                        " cannot be checkpointed: its session leader is outside its PID namespace (it was "
                        "started without setsid by a process in a parent namespace, such as a container "
                        "runtime or a CI runner), and CRIU cannot dump such a session. Production is "
                        "untouched. Start the service as the leader of its own session (`setsid SERVICE "
                        "...`, a daemonizing service, or a systemd unit) and clone it again",
                    ExitCode::unavailable);
    }
}

void require_no_terminal(const std::vector<pid_t>& tree) {
    for (pid_t pid : tree) {
        const std::string fd_dir = "/proc/" + std::to_string(pid) + "/fd";
        std::error_code ec;
        for (const auto& entry : fs::directory_iterator(fd_dir, ec)) {
            std::error_code link_ec;
            const std::string target = fs::read_symlink(entry.path(), link_ec).string();
            const bool terminal = target.starts_with("/dev/pts/") || target == "/dev/tty" ||
                                  target == "/dev/console" ||
                                  (target.starts_with("/dev/tty") && target.size() > 8 &&
                                   std::isdigit(static_cast<unsigned char>(target[8])));
            if (!terminal) continue;
            throw Error("PID " + std::to_string(pid) + " has a terminal open (" + target + " on fd " +
                            entry.path().filename().string() +
                            "): it was started from an interactive shell, and CRIU cannot restore a clone "
                            "holding another session's terminal. Production is untouched. Start the service "
                            "away from the terminal, in its own session: `setsid SERVICE ... </dev/null "
                            ">>service.log 2>&1 &` (systemd units and daemonizing services already are), then "
                            "clone it",
                        ExitCode::unavailable);
        }
    }
}

bool alive(pid_t pid) {
    if (pid <= 0) return false;
    const char s = proc::state(pid);
    return s != 0 && s != 'Z' && s != 'X';
}

std::vector<pid_t> keepers_in(const std::string& netns_path) {
    struct stat netns {};
    if (::stat(netns_path.c_str(), &netns) != 0) return {};
    std::vector<pid_t> found;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator("/proc", ec)) {
        const std::string name = e.path().filename();
        if (name.find_first_not_of("0123456789") != std::string::npos) continue;
        const pid_t pid = static_cast<pid_t>(std::stol(name));
        struct stat ns {};
        if (proc::status_field(pid, "Name").value_or("") == "iprobe-keeper" && ::stat((e.path() / "ns/net").c_str(), &ns) == 0 &&
            ns.st_dev == netns.st_dev && ns.st_ino == netns.st_ino && alive(pid))
            found.push_back(pid);
    }
    return found;
}

bool still_running(pid_t pid, const std::string& started) {
    return alive(pid) && start_time(pid) == started;
}

pid_t find_clone_root(pid_t keeper, pid_t pid_in_ns) {
    for (int i = 0; i < 200; ++i) {
        for (pid_t c : children_of(keeper))
            if (ns_pid(c) == pid_in_ns) return c;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return -1;
}

bool same_ns(pid_t pid, const char* type) {
    struct stat a, b;
    std::string mine = std::string("/proc/self/ns/") + type;
    return ::stat(("/proc/" + std::to_string(pid) + "/ns/" + type).c_str(), &a) == 0 &&
           ::stat(mine.c_str(), &b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev;
}

}  // namespace iprobe::launcher::clone_steps
