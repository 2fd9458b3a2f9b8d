#include "process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <span>

#include "iprobe/support/error.h"
#include "iprobe/support/fd.h"

namespace iprobe::launcher {
namespace {

std::vector<char*> c_argv(const std::vector<std::string>& argv) {
    std::vector<char*> out;
    out.reserve(argv.size() + 1);
    for (const auto& a : argv) out.push_back(const_cast<char*>(a.c_str()));
    out.push_back(nullptr);
    return out;
}

constexpr std::size_t kMaxHandedFds = 4;

// Children must not inherit the launcher's other descriptors (a clone would
// carry them into its checkpoint): only `kept` survive, as descriptors 3, 4,
// ... in that order.  Runs between fork and exec: nothing allocated.
void keep_only_fds(std::span<const int> kept) {
    // Each first moved above every target, so that no dup2 overwrites one
    // still to be moved; dup2 clears close-on-exec.
    int moved[kMaxHandedFds];
    const int first_free = 3 + static_cast<int>(kept.size());
    for (std::size_t i = 0; i < kept.size(); ++i) moved[i] = ::fcntl(kept[i], F_DUPFD, first_free);
    for (std::size_t i = 0; i < kept.size(); ++i) ::dup2(moved[i], 3 + static_cast<int>(i));
    ::close_range(static_cast<unsigned>(first_free), ~0U, 0);
}

std::atomic<int> g_child_note_fd{-1};

int wait_exit_code(pid_t pid) {
    int status = 0;
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR) return -1;
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

void reset_signals() noexcept {
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    signal(SIGPIPE, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
}

void stdio_to_dev_null() noexcept {
    const int devnull = ::open("/dev/null", O_RDWR);
    ::dup2(devnull, 0);
    ::dup2(devnull, 1);
    ::dup2(devnull, 2);
}

RunResult run(const std::vector<std::string>& argv, const std::function<bool()>& in_child, int fd3) {
    int out_pipe[2], err_pipe[2];
    if (pipe2(out_pipe, O_CLOEXEC) < 0) throw_errno("pipe");
    if (pipe2(err_pipe, O_CLOEXEC) < 0) {
        ::close(out_pipe[0]);
        ::close(out_pipe[1]);
        throw_errno("pipe");
    }
    auto args = c_argv(argv);
    pid_t pid = fork();
    if (pid < 0) throw_errno("fork");
    if (pid == 0) {
        note_this_child();
        setpgid(0, 0);
        reset_signals();
        int devnull = ::open("/dev/null", O_RDONLY);
        dup2(devnull, 0);
        dup2(out_pipe[1], 1);
        dup2(err_pipe[1], 2);
        if (in_child && !in_child()) {
            const char* msg = "cannot prepare the child process (namespace entry failed)\n";
            (void)!write(2, msg, strlen(msg));
            _exit(126);
        }
        keep_only_fds(fd3 < 0 ? std::span<const int>() : std::span<const int>(&fd3, 1));
        execvp(args[0], args.data());
        const char* msg = "exec failed: ";
        (void)!write(2, msg, strlen(msg));
        (void)!write(2, args[0], strlen(args[0]));
        (void)!write(2, "\n", 1);
        _exit(127);
    }
    ::close(out_pipe[1]);
    ::close(err_pipe[1]);
    UniqueFd out_fd(out_pipe[0]), err_fd(err_pipe[0]);
    RunResult result;
    pollfd fds[2] = {{out_fd.get(), POLLIN, 0}, {err_fd.get(), POLLIN, 0}};
    int open_count = 2;
    char buf[8192];
    while (open_count > 0) {
        if (poll(fds, 2, -1) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        for (int i = 0; i < 2; ++i) {
            if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
            if (n > 0) {
                (i == 0 ? result.out : result.err).append(buf, static_cast<size_t>(n));
            } else if (n == 0 || errno != EINTR) {
                fds[i].fd = -1;
                --open_count;
            }
        }
    }
    result.exit_code = wait_exit_code(pid);
    return result;
}

namespace {

constexpr int kInterruptSignals[] = {SIGINT, SIGTERM, SIGHUP};
volatile sig_atomic_t g_interrupted = 0;

void note_interrupt(int) { g_interrupted = 1; }

}  // namespace

InterruptGuard::InterruptGuard() {
    static_assert(std::size(kInterruptSignals) == std::tuple_size_v<decltype(saved_)>);
    struct sigaction sa {};
    sa.sa_handler = note_interrupt;  // no SA_RESTART: waits return to look
    sigemptyset(&sa.sa_mask);
    for (std::size_t i = 0; i < std::size(kInterruptSignals); ++i) sigaction(kInterruptSignals[i], &sa, &saved_[i]);
}

InterruptGuard::~InterruptGuard() {
    for (std::size_t i = 0; i < std::size(kInterruptSignals); ++i) sigaction(kInterruptSignals[i], &saved_[i], nullptr);
}

bool interrupted() noexcept { return g_interrupted != 0; }

void throw_if_interrupted(const std::string& undone) {
    if (interrupted())
        throw Error("interrupted; " + undone + ", production is untouched and keeps running", ExitCode::interrupted);
}

std::string run_checked(const std::vector<std::string>& argv, const std::string& what) {
    auto r = run(argv);
    if (!r.ok()) {
        std::string err = r.err;
        while (!err.empty() && err.back() == '\n') err.pop_back();
        throw Error(what + ": " + (err.empty() ? argv[0] + " exited with " + std::to_string(r.exit_code) : err));
    }
    return r.out;
}

pid_t spawn(const std::vector<std::string>& argv, int stdout_fd, int stderr_fd, bool own_group,
            const std::vector<int>& from_fd3, int stdin_fd) {
    if (from_fd3.size() > kMaxHandedFds)
        throw Error("cannot hand " + std::to_string(from_fd3.size()) + " descriptors to " + argv[0]);
    auto args = c_argv(argv);
    pid_t pid = fork();
    if (pid < 0) throw_errno("fork");
    if (pid == 0) {
        if (own_group) setpgid(0, 0);
        // Session helpers (mirror, trace) must not outlive a killed launcher.
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        reset_signals();
        int devnull = ::open("/dev/null", O_RDWR);
        dup2(stdin_fd >= 0 ? stdin_fd : devnull, 0);
        dup2(stdout_fd >= 0 ? stdout_fd : devnull, 1);
        dup2(stderr_fd >= 0 ? stderr_fd : devnull, 2);
        keep_only_fds(from_fd3);
        execvp(args[0], args.data());
        _exit(127);
    }
    if (own_group) setpgid(pid, pid);  // no race with the first signal
    return pid;
}

std::optional<std::string> read_line(int fd, std::chrono::milliseconds timeout, const std::string& what) {
    std::string line;
    const double deadline = now_ms() + static_cast<double>(timeout.count());
    while (line.find('\n') == std::string::npos) {
        pollfd p{fd, POLLIN, 0};
        const int left = static_cast<int>(deadline - now_ms());
        if (left <= 0 || ::poll(&p, 1, left) <= 0)
            throw Error(what + " did not answer within " + std::to_string(timeout.count() / 1000) + " s");
        char buf[512];
        const ssize_t n = ::read(fd, buf, sizeof buf);
        if (n <= 0) return std::nullopt;
        line.append(buf, static_cast<std::size_t>(n));
    }
    return line.substr(0, line.find('\n'));
}

std::string find_program(const std::string& name) {
    if (name.find('/') != std::string::npos) return access(name.c_str(), X_OK) == 0 ? name : std::string();
    const char* path = getenv("PATH");
    std::string dirs = path ? path : "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
    size_t start = 0;
    while (start <= dirs.size()) {
        size_t end = dirs.find(':', start);
        if (end == std::string::npos) end = dirs.size();
        std::string candidate = dirs.substr(start, end - start) + "/" + name;
        if (end > start && access(candidate.c_str(), X_OK) == 0) return candidate;
        start = end + 1;
    }
    // Root tools live in sbin, which a user's PATH may lack.
    for (const char* dir : {"/usr/sbin/", "/sbin/"}) {
        std::string candidate = std::string(dir) + name;
        if (access(candidate.c_str(), X_OK) == 0) return candidate;
    }
    return {};
}

void note_children_to(int fd) { g_child_note_fd.store(fd); }

void note_this_child() noexcept {
    const int fd = g_child_note_fd.load();
    if (fd < 0) return;
    // One record on a seqpacket socket: never interleaved with another's.
    ChildNote note;
    note.pid = ::getpid();
    (void)!::send(fd, &note, sizeof note, MSG_NOSIGNAL);
}

bool test_pause_armed(const char* step) {
    const char* armed = std::getenv("IPROBE_TEST_PAUSE");
    return armed && std::strcmp(armed, step) == 0;
}

void test_pause(const char* step) {
    if (!test_pause_armed(step)) return;
    std::fprintf(stderr, "iprobe: test pause at %s (PID %d)\n", step, static_cast<int>(::getpid()));
    std::fflush(stderr);
    ::raise(SIGSTOP);
}

double now_ms() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

}  // namespace iprobe::launcher
