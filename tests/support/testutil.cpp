#include "testutil.h"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <utility>

extern char** environ;

namespace iprobe::test {

namespace {

std::string env_or(const char* name, const std::string& fallback) {
    const char* v = std::getenv(name);
    return v && *v ? v : fallback;
}

std::vector<char*> c_argv(const std::vector<std::string>& argv) {
    std::vector<char*> out;
    for (const auto& a : argv) out.push_back(const_cast<char*>(a.c_str()));
    out.push_back(nullptr);
    return out;
}

void apply_env(const std::vector<std::string>& extra_env) {
    for (const auto& kv : extra_env) ::putenv(const_cast<char*>(kv.c_str()));
}

// ctest hands tests its log file and a pipe it waits on; a service that
// outlived its test while holding them would keep ctest waiting.
void close_inherited_fds() { ::close_range(3, ~0U, 0); }

}  // namespace

std::string build_dir() { return env_or("IPROBE_BUILD_DIR", IPROBE_TEST_BUILD_DIR); }
std::string source_dir() { return env_or("IPROBE_SOURCE_DIR", IPROBE_TEST_SOURCE_DIR); }
std::string bin(const std::string& tool) { return build_dir() + "/bin/" + tool; }

CommandResult run(const std::vector<std::string>& argv, const std::string& input,
                  std::chrono::milliseconds timeout, const std::vector<std::string>& extra_env) {
    int in_pipe[2], out_pipe[2], err_pipe[2];
    if (::pipe2(in_pipe, O_CLOEXEC) || ::pipe2(out_pipe, O_CLOEXEC) || ::pipe2(err_pipe, O_CLOEXEC))
        throw std::runtime_error("pipe failed");
    const auto args = c_argv(argv);
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
        ::dup2(in_pipe[0], 0);
        ::dup2(out_pipe[1], 1);
        ::dup2(err_pipe[1], 2);
        close_inherited_fds();
        apply_env(extra_env);
        ::execvp(args[0], args.data());
        std::fprintf(stderr, "exec %s: %s\n", args[0], std::strerror(errno));
        ::_exit(127);
    }
    ::close(in_pipe[0]);
    ::close(out_pipe[1]);
    ::close(err_pipe[1]);

    CommandResult result;
    std::size_t written = 0;
    int in_fd = in_pipe[1];
    if (input.empty()) {
        ::close(in_fd);
        in_fd = -1;
    } else {
        ::fcntl(in_fd, F_SETFL, O_NONBLOCK);
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    bool out_open = true, err_open = true, killed = false;
    char buf[65536];
    while (out_open || err_open) {
        pollfd fds[3];
        int n = 0;
        if (out_open) fds[n++] = {out_pipe[0], POLLIN, 0};
        if (err_open) fds[n++] = {err_pipe[0], POLLIN, 0};
        if (in_fd >= 0) fds[n++] = {in_fd, POLLOUT, 0};
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            deadline - std::chrono::steady_clock::now());
        if (left.count() <= 0 && !killed) {
            ::kill(pid, SIGKILL);
            killed = true;
        }
        ::poll(fds, n, killed ? 1000 : static_cast<int>(std::min<long>(left.count(), 1000)));
        for (int i = 0; i < n; ++i) {
            if (!fds[i].revents) continue;
            if (fds[i].fd == in_fd) {
                const ssize_t w = ::write(in_fd, input.data() + written, input.size() - written);
                if (w > 0) written += static_cast<std::size_t>(w);
                if (w < 0 && errno != EAGAIN) written = input.size();
                if (written == input.size()) {
                    ::close(in_fd);
                    in_fd = -1;
                }
                continue;
            }
            const ssize_t r = ::read(fds[i].fd, buf, sizeof buf);
            if (r > 0) {
                (fds[i].fd == out_pipe[0] ? result.out : result.err).append(buf, static_cast<std::size_t>(r));
            } else if (r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN)) {
                if (fds[i].fd == out_pipe[0]) out_open = false; else err_open = false;
            }
        }
    }
    if (in_fd >= 0) ::close(in_fd);
    ::close(out_pipe[0]);
    ::close(err_pipe[0]);
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) result.signal = WTERMSIG(status);
    if (killed) result.err += "\n[test harness: killed after timeout]\n";
    return result;
}

CommandResult sh(const std::string& command_line, std::chrono::milliseconds timeout) {
    return run({"/bin/sh", "-c", command_line}, {}, timeout);
}

TempDir::TempDir() {
    std::string tmpl = std::filesystem::temp_directory_path().string() + "/iprobe-test.XXXXXX";
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
}

TempDir::~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
}

Child::Child(const std::vector<std::string>& argv, const std::string& stdout_path,
             const std::vector<std::string>& extra_env, Session session) {
    const auto args = c_argv(argv);
    own_group_ = session == Session::own;
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
        if (session == Session::own) ::setsid();
        const int fd = ::open(stdout_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            ::dup2(fd, 1);
            ::dup2(fd, 2);
        }
        const int null_fd = ::open("/dev/null", O_RDONLY);
        if (null_fd >= 0) ::dup2(null_fd, 0);
        close_inherited_fds();
        apply_env(extra_env);
        ::execvp(args[0], args.data());
        ::_exit(127);
    }
}

Child::Child(Child&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)), reaped_(other.reaped_), status_(other.status_),
      own_group_(other.own_group_) {}

Child& Child::operator=(Child&& other) noexcept {
    if (this != &other) {
        kill();
        pid_ = std::exchange(other.pid_, -1);
        reaped_ = other.reaped_;
        status_ = other.status_;
        own_group_ = other.own_group_;
    }
    return *this;
}

Child::~Child() { kill(); }

bool Child::running() {
    if (pid_ <= 0 || reaped_) return false;
    const pid_t r = ::waitpid(pid_, &status_, WNOHANG);
    if (r == pid_) reaped_ = true;
    return !reaped_;
}

int Child::wait(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (running()) {
        if (std::chrono::steady_clock::now() > deadline) return -1;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (pid_ <= 0) return -1;
    return WIFEXITED(status_) ? WEXITSTATUS(status_) : -1;
}

void Child::kill(int sig) {
    if (pid_ <= 0 || reaped_) return;
    // A session leader also leads its process group: what it started there
    // (a shell's background jobs) goes with it.
    if (own_group_) ::kill(-pid_, sig);
    ::kill(pid_, sig);
    if (sig == SIGKILL) {
        ::waitpid(pid_, &status_, 0);
        reaped_ = true;
    }
}

bool wait_for_port(int port, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
        const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in addr{};
        addr.sin_family = AF_INET;
        addr.sin_port = htons(static_cast<uint16_t>(port));
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
        ::close(fd);
        if (ok) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
}

int free_port() {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    socklen_t len = sizeof addr;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    ::close(fd);
    return ntohs(addr.sin_port);
}

std::vector<std::uint8_t> file_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::string file_text(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

bool is_root() { return ::geteuid() == 0; }

CpuTimes cpu_times(pid_t pid) {
    CpuTimes t;
    std::error_code ec;
    for (const auto& task : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
        std::ifstream in(task.path() / "schedstat");
        std::uint64_t on_cpu = 0, waiting = 0;
        if (in >> on_cpu >> waiting) {
            t.on_cpu_ns += on_cpu;
            t.waiting_ns += waiting;
        }
    }
    return t;
}

ToolsForAnotherUser::ToolsForAnotherUser() {
    namespace fs = std::filesystem;
    std::string tmpl = "/tmp/iprobe-tools.XXXXXX";
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    root_ = tmpl;
    const fs::path from = build_dir(), to = root_;
    const auto all = fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec | fs::perms::others_read |
                     fs::perms::others_exec;
    fs::permissions(to, all);
    for (const char* dir : {"bin", "libexec/iprobe", "lib"}) fs::create_directories(to / dir);
    fs::copy_file(from / "bin/iprobe", to / "bin/iprobe");
    fs::copy(from / "libexec/iprobe", to / "libexec/iprobe", fs::copy_options::recursive | fs::copy_options::copy_symlinks);
    fs::copy_file(from / "lib/libiprobe-rt.so", to / "lib/libiprobe-rt.so");
    for (const auto& entry : fs::recursive_directory_iterator(to))
        if (entry.is_directory()) fs::permissions(entry.path(), all);
}

ToolsForAnotherUser::~ToolsForAnotherUser() {
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
}

std::string ToolsForAnotherUser::reachable(const std::string& file) const {
    namespace fs = std::filesystem;
    const fs::path copy = fs::path(root_) / fs::path(file).filename();
    fs::copy_file(file, copy, fs::copy_options::overwrite_existing);
    fs::permissions(copy, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read | fs::perms::others_read);
    return copy.string();
}

std::vector<std::string> ToolsForAnotherUser::as_nobody(std::vector<std::string> args) {
    args.insert(args.begin(), {"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"});
    return args;
}

std::string cloning_unavailable() {
    static const std::string why = [] {
        if (!is_root()) return std::string("iprobe clone needs root (CRIU, namespaces)");
        std::string criu;
        if (const char* env = std::getenv("IPROBE_CRIU"); env && *env) criu = env;
        else if (const auto own = source_dir() + "/third_party/cache/criu/bin/criu"; ::access(own.c_str(), X_OK) == 0)
            criu = own;
        else criu = "criu";
        const auto r = run({criu, "check"}, {}, std::chrono::seconds(60));
        if (r.exit_code == 127 || r.exit_code < 0) return std::string();  // not installed: not a reason to skip
        if (r.exit_code == 0) return std::string();
        std::string said = r.err.empty() ? r.out : r.err;
        if (const auto nl = said.find('\n'); nl != std::string::npos) said.resize(nl);
        return "CRIU cannot checkpoint on this kernel (`" + criu + " check` exit " + std::to_string(r.exit_code) +
               ": " + said + ")";
    }();
    return why;
}

std::string build_redis(const std::string& mode) {
    const auto r = run({source_dir() + "/scripts/build-redis", "--mode", mode, build_dir() + "/redis/" + mode}, {},
                       std::chrono::minutes(20), {"IPROBE_BUILD_DIR=" + build_dir()});
    if (r.exit_code != 0) {
        ADD_FAILURE() << "scripts/build-redis --mode " << mode << " failed (exit " << r.exit_code << "):\n" << r.err;
        return {};
    }
    return r.out.substr(0, r.out.find('\n'));
}

RedisServer::RedisServer(const std::string& server, const TempDir& tmp, const std::string& name)
    : port_(free_port()) {
    child_ = Child({server, "--port", std::to_string(port_), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                    "no", "--dir", tmp.path(), "--daemonize", "no", "--logfile", tmp / (name + ".log")});
    ready_ = wait_for_port(port_, std::chrono::seconds(20));
}

RedisServer::~RedisServer() {
    child_.kill(SIGKILL);
    child_.wait();
}

}  // namespace iprobe::test
