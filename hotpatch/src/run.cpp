#include "iprobe/hotpatch/run.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include "inject.h"
#include "iprobe/support/error.h"

extern char** environ;

namespace iprobe::hotpatch {

namespace {

// The names runtime/src/rt.c reads (run_hold).
constexpr const char* kFdVariable = "IPROBE_RUN_FD";
constexpr const char* kPreloadVariable = "IPROBE_RUN_LD_PRELOAD";
// The first byte on the channel: the runtime's (held), or exec_held's.
constexpr unsigned char kHeld = 'r';
constexpr unsigned char kExecFailed = 'e';

bool read_byte(int fd, unsigned char& byte) {
    for (;;) {
        const ssize_t n = ::read(fd, &byte, 1);
        if (n == 1) return true;
        if (n < 0 && errno == EINTR) continue;
        return false;
    }
}

void write_byte(int fd, unsigned char byte) {
    while (::write(fd, &byte, 1) < 0 && errno == EINTR) {
    }
}

}  // namespace

HoldChannel HoldChannel::open() {
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) throw_errno("socketpair");
    return {fds[0], fds[1]};
}

std::string runtime_to_preload(const AttachOptions& options) { return runtime_path_of(options); }

void exec_held(const std::vector<std::string>& command, const std::string& runtime, int program_fd) {
    const int flags = ::fcntl(program_fd, F_GETFD);
    if (flags < 0 || ::fcntl(program_fd, F_SETFD, flags & ~FD_CLOEXEC) != 0) return;
    const char* preload = std::getenv("LD_PRELOAD");
    std::string value = runtime;
    if (preload && *preload) {
        value += ":" + std::string(preload);
        ::setenv(kPreloadVariable, preload, 1);
    } else {
        ::unsetenv(kPreloadVariable);
    }
    ::setenv("LD_PRELOAD", value.c_str(), 1);
    ::setenv(kFdVariable, std::to_string(program_fd).c_str(), 1);
    std::vector<char*> argv;
    for (const auto& a : command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execvp(argv[0], argv.data());
    const int err = errno;
    write_byte(program_fd, kExecFailed);
    errno = err;
}

std::optional<AttachStats> enable_when_held(int prober_fd, pid_t program, const AttachOptions& options,
                                            const std::function<void()>& before_release) {
    unsigned char first = 0;
    const bool said = read_byte(prober_fd, first);
    if (said && first == kExecFailed) return std::nullopt;
    if (!said || first != kHeld)
        throw Error("process " + std::to_string(program) +
                        " exited or exec'd without loading the iprobe runtime (a statically linked or set-user-ID "
                        "program ignores LD_PRELOAD): it ran without probes",
                    ExitCode::unavailable);
    AttachOptions o = options;
    o.pid = program;
    try {
        const AttachStats stats = attach(o);
        if (before_release) before_release();
        write_byte(prober_fd, 0);
        return stats;
    } catch (const Error& e) {
        write_byte(prober_fd, static_cast<unsigned char>(e.code() == ExitCode::ok ? ExitCode::failure : e.code()));
        throw;
    } catch (...) {
        write_byte(prober_fd, static_cast<unsigned char>(ExitCode::failure));
        throw;
    }
}

}  // namespace iprobe::hotpatch
