// Helpers shared by the test suites: run real commands, find the build tree,
// scratch directories, child processes that are always reaped.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace iprobe::test {

// Build and source trees (from ctest's environment, with fallbacks).
std::string build_dir();
std::string source_dir();
std::string bin(const std::string& tool);  // build/bin/<tool>

struct CommandResult {
    int exit_code = -1;   // -1 when killed by a signal
    int signal = 0;
    std::string out;
    std::string err;
};

// Runs `argv` (no shell), optional stdin text, with a timeout (killed after).
CommandResult run(const std::vector<std::string>& argv, const std::string& input = {},
                  std::chrono::milliseconds timeout = std::chrono::seconds(120),
                  const std::vector<std::string>& extra_env = {});
// Runs a shell command line through /bin/sh -c.
CommandResult sh(const std::string& command_line,
                 std::chrono::milliseconds timeout = std::chrono::seconds(120));

// A directory that is removed (recursively) when the object dies.
class TempDir {
public:
    TempDir();
    ~TempDir();
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
    const std::string& path() const { return path_; }
    std::string operator/(const std::string& name) const { return path_ + "/" + name; }

private:
    std::string path_;
};

// Whether a Child leads a session of its own, as daemons and systemd
// services do, or joins the test's (whose leader may sit outside the test's
// PID namespace, e.g. under a CI runner).
enum class Session { inherit, own };

// A background child process; killed (SIGKILL) and reaped on destruction.
class Child {
public:
    Child() = default;
    explicit Child(const std::vector<std::string>& argv, const std::string& stdout_path = "/dev/null",
                   const std::vector<std::string>& extra_env = {}, Session session = Session::inherit);
    Child(Child&& other) noexcept;
    Child& operator=(Child&& other) noexcept;
    ~Child();
    pid_t pid() const { return pid_; }
    bool running();                       // not yet exited
    int wait(std::chrono::milliseconds timeout = std::chrono::seconds(30));  // exit code, -1 on timeout/signal
    void kill(int sig = 9);               // with Session::own, its whole process group

private:
    pid_t pid_ = -1;
    bool reaped_ = false;
    int status_ = 0;
    bool own_group_ = false;
};

// Polls until a TCP port on 127.0.0.1 accepts connections.
bool wait_for_port(int port, std::chrono::milliseconds timeout = std::chrono::seconds(10));
// A port number that was free a moment ago.
int free_port();

// redis-server built from Debian source by scripts/build-redis --mode MODE
// into <build>/redis/MODE (reused when already built); "" after a failed
// build, which is reported as a test failure with the build's stderr.
std::string build_redis(const std::string& mode);

// A redis-server (path from build_redis) on a free port of 127.0.0.1, no
// persistence, working directory `tmp`, log tmp/NAME.log.  Killed on
// destruction, and the iprobe region a probe session left for it removed.
class RedisServer {
public:
    RedisServer(const std::string& server, const TempDir& tmp, const std::string& name = "redis");
    ~RedisServer();
    RedisServer(const RedisServer&) = delete;
    RedisServer& operator=(const RedisServer&) = delete;
    int port() const { return port_; }
    bool ready() const { return ready_; }  // accepted a connection within 20 s
    pid_t pid() const { return child_.pid(); }
    bool running() { return child_.running(); }

private:
    int port_;
    Child child_;
    bool ready_ = false;
};

// The iprobe tools where another, unprivileged user can run them, for tests
// that check what such a user is refused: the checkout may sit under a
// directory of mode 0700 (a home: CI clones there), out of that user's
// reach.  bin/iprobe, libexec/iprobe and the runtime are copied into a
// directory of mode 0755 under /tmp, removed on destruction.
class ToolsForAnotherUser {
public:
    ToolsForAnotherUser();
    ~ToolsForAnotherUser();
    ToolsForAnotherUser(const ToolsForAnotherUser&) = delete;
    ToolsForAnotherUser& operator=(const ToolsForAnotherUser&) = delete;
    std::string iprobe() const { return root_ + "/bin/iprobe"; }
    // A copy of `file` (a probe list the user must read), readable by all.
    std::string reachable(const std::string& file) const;
    // argv that runs `args` as nobody (uid/gid 65534, no groups).
    static std::vector<std::string> as_nobody(std::vector<std::string> args);

private:
    std::string root_;
};

// How much of the machine a process got: the time its threads ran on a CPU
// and the time they were runnable but waited for one (the run queue), from
// /proc/PID/task/*/schedstat.  For capacity tests, to tell "too slow" from
// "the machine was too busy to judge".
struct CpuTimes {
    std::uint64_t on_cpu_ns = 0;
    std::uint64_t waiting_ns = 0;
};
CpuTimes cpu_times(pid_t pid);

std::vector<std::uint8_t> file_bytes(const std::string& path);
std::string file_text(const std::string& path);
bool is_root();

// Why `iprobe clone` cannot work on this machine ("" when it can): not root,
// or a kernel the installed CRIU cannot checkpoint on (`criu check` fails).
// A CRIU that is missing is not a reason: installing it is scripts/setup's
// job, and the tests then fail loudly.
std::string cloning_unavailable();

}  // namespace iprobe::test

// Skips the test, with the reason, where cloning cannot work here.
#define IPROBE_SKIP_UNLESS_CLONING_WORKS()                                              \
    do {                                                                                \
        if (const std::string why = ::iprobe::test::cloning_unavailable(); !why.empty()) \
            GTEST_SKIP() << why;                                                        \
    } while (0)
