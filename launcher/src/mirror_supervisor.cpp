// The debug session's mirror child and its channels (mirror_supervisor.h).
#include "iprobe/launcher/mirror_supervisor.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "iprobe/support/error.h"
#include "process.h"

namespace iprobe::launcher {

void MirrorSupervisor::start(std::vector<std::string> argv) {
    int out[2], ready[2], control[2];
    if (::pipe2(out, O_CLOEXEC) < 0 || ::pipe2(ready, O_CLOEXEC) < 0 ||
        ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, control) < 0)
        throw_errno("pipe");
    UniqueFd out_rd(out[0]), out_wr(out[1]), ready_rd(ready[0]), ready_wr(ready[1]), control_ours(control[0]),
        control_theirs(control[1]);
    argv.insert(argv.end(), {"--control-fd", "4"});
    pid_ = spawn(argv, out_wr.get(), 2, true, {ready_wr.get(), control_theirs.get()});
    out_wr.reset();
    ready_wr.reset();
    control_theirs.reset();
    const auto event_line = read_line(ready_rd.get(), std::chrono::seconds(10), "iprobe mirror");
    if (!event_line) {
        int status = 0;
        ::waitpid(pid_, &status, 0);
        pid_ = -1;
        const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
        throw Error("iprobe mirror exited before it was ready (see its message above)",
                    code > 0 && code <= 7 ? static_cast<ExitCode>(code) : ExitCode::failure);
    }
    const proxy::MirrorReady ready_event = proxy::parse_ready_event(*event_line);
    if (!ready_event.stats) throw Error("iprobe mirror reported no stats endpoint");
    stats_at_ = *ready_event.stats;
    out_ = std::move(out_rd);
    control_ = std::move(control_ours);
}

void MirrorSupervisor::relay_output(int to) {
    char buf[512];
    const ssize_t n = ::read(out_.get(), buf, sizeof buf);
    if (n > 0 && to >= 0) (void)!::write(to, buf, static_cast<size_t>(n));
    // Closed: nothing more to relay, and nothing to poll for.
    if (n == 0) out_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
}

std::optional<std::string> MirrorSupervisor::stats_document() const {
    return proxy::fetch_mirror_stats(stats_at_, std::chrono::seconds(2));
}

std::optional<proxy::MirrorStats> MirrorSupervisor::stats() const {
    const auto doc = stats_document();
    if (!doc) return std::nullopt;
    return proxy::parse_mirror_stats(*doc);
}

proxy::MirrorCommandReply MirrorSupervisor::command(const proxy::MirrorCommand& c, const std::string& what) {
    const std::string line = proxy::to_json(c) + "\n";
    if (::send(control_.get(), line.data(), line.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(line.size()))
        throw Error("the mirror's control socket is closed");
    const auto reply = read_line(control_.get(), std::chrono::seconds(5), what);
    if (!reply) throw Error("the mirror's control socket closed");
    return proxy::parse_mirror_command_reply(*reply);
}

std::uint64_t MirrorSupervisor::record(const std::string& path) {
    const proxy::MirrorCommandReply r =
        command(proxy::MirrorCommand{proxy::MirrorCommand::Kind::record, path}, "the mirror's recording command");
    if (!r.ok) throw Error("the mirror could not record into " + path + ": " + r.error);
    return r.open_connections;
}

proxy::MirrorCommandReply MirrorSupervisor::release() {
    proxy::MirrorCommandReply r =
        command(proxy::MirrorCommand{proxy::MirrorCommand::Kind::release, ""}, "the mirror's release command");
    if (!r.ok) throw Error("the mirror could not feed the clone from the checkpoint: " + r.error);
    return r;
}

std::optional<std::string> MirrorSupervisor::ended() {
    int status = 0;
    if (pid_ <= 0 || ::waitpid(pid_, &status, WNOHANG) != pid_) return std::nullopt;
    pid_ = -1;
    return WIFSIGNALED(status) ? std::string("was killed by signal ") + ::strsignal(WTERMSIG(status))
                               : "exited with " + std::to_string(WEXITSTATUS(status));
}

void MirrorSupervisor::stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    int status;
    for (int i = 0; i < 300; ++i) {
        if (::waitpid(pid_, &status, WNOHANG) == pid_) {
            pid_ = -1;
            return;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
}

}  // namespace iprobe::launcher
