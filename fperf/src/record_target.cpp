#include "record_target.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "iprobe/fperf/attach.h"
#include "iprobe/fperf/symbols.h"
#include "iprobe/support/error.h"
#include "iprobe/support/fd.h"
#include "iprobe/support/proc.h"

extern char** environ;

namespace iprobe::fperf {

namespace {

std::string join_env_list(const char* existing, const std::string& add) {
    if (!existing || !*existing) return add;
    return add + ":" + existing;
}

}  // namespace

std::vector<proc::Mapping> file_mappings(pid_t pid) {
    std::vector<proc::Mapping> out;
    try {
        for (auto& m : proc::read_maps(pid))
            if (m.file_backed()) out.push_back(std::move(m));
    } catch (const Error&) {
    }
    return out;
}

std::string exe_of(pid_t pid) {
    char buf[PATH_MAX];
    const auto n = ::readlink(("/proc/" + std::to_string(pid) + "/exe").c_str(), buf, sizeof buf - 1);
    if (n <= 0) return {};
    buf[n] = '\0';
    std::string path(buf);
    const std::string deleted = " (deleted)";
    if (path.size() > deleted.size() && path.ends_with(deleted)) path.resize(path.size() - deleted.size());
    return path;
}

std::optional<std::uint64_t> load_bias(pid_t pid, const std::string& path) {
    const auto vaddr = first_load_vaddr(path);
    if (!vaddr) return std::nullopt;
    std::optional<std::uint64_t> lowest;
    for (const auto& m : file_mappings(pid))
        if (m.path == path && (!lowest || m.start < *lowest)) lowest = m.start;
    if (!lowest) return std::nullopt;
    return *lowest - *vaddr;
}

bool handler_mapped(pid_t pid, const std::string& handler) {
    for (const auto& m : file_mappings(pid))
        if (m.path == handler) return true;
    return false;
}

std::string describe_status(int status) {
    if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
    if (WIFSIGNALED(status)) return std::string("was killed by signal ") + ::strsignal(WTERMSIG(status));
    return "stopped";
}

pid_t spawn_stopped_later(const std::vector<std::string>& command, const std::string& handler, int& go_fd) {
    int pipe_fds[2];
    if (::pipe2(pipe_fds, O_CLOEXEC) != 0) iprobe::throw_errno("pipe");
    std::vector<std::string> env_strings;
    for (char** e = environ; *e; e++) {
        const std::string_view kv(*e);
        if (kv.starts_with("LD_PRELOAD=") || kv.starts_with("FPERF_STOP_AFTER_INIT=")) continue;
        env_strings.emplace_back(kv);
    }
    std::string preload = handler;
    for (const auto& lib : libraries_to_preload())
        if (::access(lib.c_str(), R_OK) == 0) preload += ":" + lib;
    env_strings.push_back("LD_PRELOAD=" + join_env_list(std::getenv("LD_PRELOAD"), preload));
    env_strings.push_back("FPERF_STOP_AFTER_INIT=1");
    std::vector<char*> envp;
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<char*> argv;
    for (const auto& a : command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);

    const pid_t pid = ::fork();
    if (pid < 0) iprobe::throw_errno("fork");
    if (pid == 0) {
        ::close(pipe_fds[1]);
        char byte = 0;
        if (::read(pipe_fds[0], &byte, 1) != 1) ::_exit(126);  // parent gave up
        ::execvpe(argv[0], argv.data(), envp.data());
        std::fprintf(stderr, "fperf: cannot run %s: %s\n", argv[0], std::strerror(errno));
        ::_exit(127);
    }
    ::close(pipe_fds[0]);
    go_fd = pipe_fds[1];
    return pid;
}

std::optional<TargetRun> target_run(pid_t pid) {
    const std::string dir = "/proc/" + std::to_string(pid) + "/task";
    std::error_code ec;
    TargetRun total;
    bool any = false;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
        std::ifstream in(entry.path() / "schedstat");
        unsigned long long on_cpu = 0, waited = 0, timeslices = 0;  // ns run, ns runnable, times run
        if (in >> on_cpu >> waited >> timeslices) {
            total.cpu_ns += on_cpu;
            total.switches += timeslices;
            any = true;
        }
    }
    if (!any) return std::nullopt;
    return total;
}

}  // namespace iprobe::fperf
