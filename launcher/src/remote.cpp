#include "iprobe/launcher/remote.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <linux/sockios.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <map>
#include <thread>

#include <nlohmann/json.hpp>

#include "client_pinger.h"
#include "clone_guardian.h"
#include "name_claim.h"
#include "clone_steps.h"
#include "iprobe/launcher/agent_protocol.h"
#include "criu.h"
#include "iprobe/proxy/address.h"
#include "iprobe/support/error.h"
#include "iprobe/support/json.h"
#include "iprobe/support/fd.h"
#include "iprobe/support/file.h"
#include "process.h"

namespace fs = std::filesystem;

namespace iprobe::launcher {

using namespace clone_steps;

namespace {

namespace protocol = agent_protocol;

// The control protocol: agent_protocol.h.
constexpr std::size_t kMaxLine = 64 * 1024;
constexpr int kIoTimeoutMs = 30000;
constexpr int kRestoreTimeoutMs = 600000;

// A blocking control connection where every wait has a deadline.
class Channel {
public:
    explicit Channel(UniqueFd fd) : fd_(std::move(fd)) {}

    void send(const protocol::Message& message) {
        const std::string line = protocol::encode(message);
        write_all(line.data(), line.size());
    }

    protocol::Message receive(int timeout_ms = kIoTimeoutMs) { return protocol::decode(read_line(timeout_ms)); }

    // A file's bytes after `header` (protocol::File or protocol::Snapshot),
    // whose size is set here.
    template <typename Header>
    void send_file(Header header, const std::string& path) {
        UniqueFd file(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
        if (!file) throw_errno("open " + path);
        header.size = fs::file_size(path);
        send(header);
        char chunk[1 << 16];
        for (std::uintmax_t sent = 0; sent < header.size;) {
            const ssize_t n = ::read(file.get(), chunk, sizeof chunk);
            if (n <= 0) throw_errno("read " + path);
            write_all(chunk, static_cast<std::size_t>(n));
            sent += static_cast<std::uintmax_t>(n);
        }
    }

    void receive_file(const std::string& path, std::uint64_t size) {
        UniqueFd file(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
        if (!file) throw_errno("create " + path);
        char chunk[1 << 16];
        for (std::uint64_t got = 0; got < size;) {
            const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(sizeof chunk, size - got));
            const std::size_t n = read_some(chunk, want, kIoTimeoutMs);
            if (::write(file.get(), chunk, n) != static_cast<ssize_t>(n)) throw_errno("write " + path);
            got += n;
        }
    }

private:
    std::string read_line(int timeout_ms) {
        for (;;) {
            const auto newline = buffered_.find('\n');
            if (newline != std::string::npos) {
                std::string line = buffered_.substr(0, newline);
                buffered_.erase(0, newline + 1);
                return line;
            }
            if (buffered_.size() > kMaxLine) throw Error("the peer sent a line longer than 64 KiB", ExitCode::bad_input);
            char chunk[4096];
            buffered_.append(chunk, read_some(chunk, sizeof chunk, timeout_ms));
        }
    }

    void write_all(const char* data, std::size_t size) {
        while (size > 0) {
            pollfd p{fd_.get(), POLLOUT, 0};
            if (::poll(&p, 1, kIoTimeoutMs) <= 0) throw Error("the peer stopped reading for 30 s; giving up");
            const ssize_t n = ::send(fd_.get(), data, size, MSG_NOSIGNAL);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) throw_errno("the connection broke while sending");
            data += n;
            size -= static_cast<std::size_t>(n);
        }
    }

    std::size_t read_some(char* out, std::size_t size, int timeout_ms) {
        if (!buffered_.empty()) {
            const std::size_t n = std::min(size, buffered_.size());
            std::memcpy(out, buffered_.data(), n);
            buffered_.erase(0, n);
            return n;
        }
        for (;;) {
            pollfd p{fd_.get(), POLLIN, 0};
            const int ready = ::poll(&p, 1, timeout_ms);
            if (ready < 0 && errno == EINTR) continue;
            if (ready == 0) throw Error("no answer within " + std::to_string(timeout_ms / 1000) + " s");
            const ssize_t n = ::recv(fd_.get(), out, size, 0);
            if (n < 0 && errno == EINTR) continue;
            if (n == 0) throw Error("the connection was closed by the other side");
            if (n < 0) throw_errno("the connection broke while receiving");
            return static_cast<std::size_t>(n);
        }
    }

    UniqueFd fd_;
    std::string buffered_;
};

// A reply of the expected kind, or the agent's error as ours.
template <typename Reply>
Reply expect_reply(Channel& channel, int timeout_ms) {
    const protocol::Message message = channel.receive(timeout_ms);
    if (const auto* failure = std::get_if<protocol::Failure>(&message))
        throw Error("the clone agent says: " + failure->message,
                    failure->exit_code > 0 && failure->exit_code < 256 ? static_cast<ExitCode>(failure->exit_code)
                                                                        : ExitCode::failure);
    if (const auto* reply = std::get_if<Reply>(&message)) return *reply;
    throw Error(std::string("the clone agent answered '") + protocol::type_name(message) + "', expected '" +
                    protocol::type_name(Reply{}) + "'",
                ExitCode::bad_input);
}

std::string host_of(const proxy::Endpoint& at) {
    const std::string s = at.str();
    const auto colon = s.rfind(':');
    std::string host = s.substr(0, colon);
    if (host.size() > 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
    return host;
}

proxy::Endpoint with_port(proxy::Endpoint at, int port) {
    if (at.family() == AF_INET6)
        reinterpret_cast<sockaddr_in6&>(at.addr).sin6_port = htons(static_cast<std::uint16_t>(port));
    else
        reinterpret_cast<sockaddr_in&>(at.addr).sin_port = htons(static_cast<std::uint16_t>(port));
    return at;
}

// Connects with a deadline; an invalid fd and `err` set on failure.
UniqueFd connect_within(const proxy::Endpoint& at, int timeout_ms, int& err) {
    UniqueFd fd = proxy::start_connect(at);
    err = fd ? 0 : errno;
    if (fd) {
        pollfd p{fd.get(), POLLOUT, 0};
        if (::poll(&p, 1, timeout_ms) <= 0) {
            err = ETIMEDOUT;
        } else {
            socklen_t len = sizeof err;
            ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
        }
    }
    if (err != 0) return UniqueFd();
    ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) & ~O_NONBLOCK);
    return fd;
}

UniqueFd connect_to(const proxy::Endpoint& at, const std::string& agent) {
    int err = 0;
    UniqueFd fd = connect_within(at, 5000, err);
    if (!fd)
        throw Error("cannot reach the clone agent at " + agent + ": " + std::strerror(err) +
                        "; start one on that host with `iprobe clone-agent --listen " + agent + " --state-dir DIR`",
                    ExitCode::unavailable);
    return fd;
}

// CRIU's connection to the page server, made by us from production's network
// namespace (where CRIU's own would start) so that it can be watched by a
// CorkedTailPusher while CRIU uses it (`criu dump --ps-socket`).
UniqueFd connect_page_server(pid_t production, const proxy::Endpoint& at) {
    UniqueFd netns;
    if (!same_ns(production, "net")) {
        netns.reset(::open(("/proc/" + std::to_string(production) + "/ns/net").c_str(), O_RDONLY | O_CLOEXEC));
        if (!netns) throw_errno("open production's network namespace");
    }
    UniqueFd fd;
    int err = 0;
    // A namespace is a property of the thread: enter it on one of our own.
    std::thread([&] {
        if (netns && ::setns(netns.get(), CLONE_NEWNET) != 0) {
            err = errno;
            return;
        }
        fd = connect_within(at, 5000, err);
    }).join();
    if (!fd)
        throw Error("cannot reach CRIU's page server at " + at.str() + " from production's network: " +
                        std::strerror(err),
                    ExitCode::unavailable);
    return fd;
}

// CRIU corks its page-server socket and sends its last request, closing the
// session, without uncorking; it then waits for the answer while production
// is still frozen.  The few bytes leave only when the kernel's probe timer
// fires, 200 ms later (criu/page-xfer.c, disconnect_from_page_server, in 4.2.1
// and upstream).  While the dump runs this watches the socket CRIU was handed
// and pushes out what the cork holds once nothing else is in flight, which is
// what CRIU's other requests do for themselves with TCP_NODELAY: production's
// freeze shrinks by those 200 ms (bench/RESULTS.md, "a clone on a second host").
class CorkedTailPusher {
public:
    explicit CorkedTailPusher(int fd) : fd_(fd), thread_([this](std::stop_token stop) { watch(stop); }) {}

private:
    void watch(std::stop_token stop) const {
        bool held_before = false;
        while (!stop.stop_requested()) {
            int unsent = 0, queued = 0;
            const bool held = ::ioctl(fd_, SIOCOUTQNSD, &unsent) == 0 && ::ioctl(fd_, SIOCOUTQ, &queued) == 0 &&
                              unsent > 0 && queued == unsent;
            // Held for two looks in a row: corked, not just between writes.
            if (held && held_before) {
                const int on = 1;
                ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
            }
            held_before = held && !held_before;
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
    }

    int fd_;
    std::jthread thread_;
};

// The object `fields` writes, one line, written atomically.
void write_json(const std::string& path, const std::function<void(JsonWriter&)>& fields) {
    JsonWriter j;
    fields(j.begin_object());
    const std::string text = j.end_object().str() + "\n";
    write_file_atomic(path, text.data(), text.size());
}

nlohmann::json read_json(const std::string& path) {
    std::ifstream in(path);
    return in ? nlohmann::json::parse(in, nullptr, false) : nlohmann::json();
}

// Where `iprobe clone --to` notes the clones it made on other hosts
// (kRemoteRoot), and where each running agent notes itself (its address and
// state directory).
const char* const kAgentRoot = "/run/iprobe/agents";

std::string remote_record(const std::string& name) { return std::string(kRemoteRoot) + "/" + name; }

// The agent's own record, removed when it stops.
class AgentRegistration {
public:
    AgentRegistration(const std::string& listen, const std::string& state_dir)
        : path_(std::string(kAgentRoot) + "/" + std::to_string(::getpid()) + ".json") {
        fs::create_directories(kAgentRoot);
        write_json(path_, [&](JsonWriter& j) {
            j.field("pid", ::getpid()).field("start", start_time(::getpid())).field("listen", listen);
            j.field("state_dir", fs::absolute(state_dir).string());
        });
    }
    ~AgentRegistration() {
        std::error_code ec;
        fs::remove(path_, ec);
    }
    AgentRegistration(const AgentRegistration&) = delete;
    AgentRegistration& operator=(const AgentRegistration&) = delete;

private:
    std::string path_;
};

// ---- the agent ---------------------------------------------------------------

struct AgentClone {
    std::string dir;
    pid_t keeper = -1;
    std::string keeper_started;
};

class Agent {
public:
    Agent(const AgentOptions& o, Criu criu) : options_(o), criu_(std::move(criu)) {}

    ~Agent() {
        for (auto& [name, clone] : clones_) {
            kill_keeper(clone.keeper, clone.keeper_started);
            remove_tree(clone.dir);
            say("clone " + name + " destroyed (agent stopping)");
        }
    }

    void serve(Channel& channel, const std::string& address) {
        const protocol::Message request = channel.receive();
        if (const auto* clone = std::get_if<protocol::Clone>(&request)) return receive_clone(channel, address, *clone);
        if (const auto* destroy = std::get_if<protocol::Destroy>(&request)) return destroy_clone(channel, destroy->name);
        throw Error(std::string("'") + protocol::type_name(request) + "' is not a request this agent serves",
                    ExitCode::usage);
    }

private:
    void say(const std::string& line) const {
        if (options_.progress) options_.progress(line);
    }

    void receive_clone(Channel& channel, const std::string& address, const protocol::Clone& request) {
        const std::string& name = request.name;
        validate_name(name);
        const bool shell_job = request.shell_job;
        const pid_t source = request.source_pid;
        const std::string dir = options_.state_dir + "/" + name;
        if (clones_.count(name) || fs::exists(dir))
            throw Error("this agent already holds a clone named '" + name + "'", ExitCode::busy);
        fs::create_directories(dir + "/images");
        struct Partial {
            std::string dir;
            pid_t page_server = -1;
            bool armed = true;
            ~Partial() {
                if (!armed) return;
                if (page_server > 0) ::kill(page_server, SIGKILL);
                remove_tree(dir);
            }
        } partial{dir};

        const PageServer ps = criu_page_server(criu_.path, dir + "/images", dir + "/page-server.log", address);
        if (!ps.reply.success || ps.pid <= 0 || ps.port <= 0)
            throw Error("CRIU's page server did not start on " + address + ": " + ps.reply.describe() +
                        keep_criu_log(dir + "/page-server.log", name, "page-server"));
        partial.page_server = ps.pid;
        say("clone " + name + ": page server on " + address + ":" + std::to_string(ps.port));
        channel.send(protocol::PageServerReady{ps.port});

        std::vector<std::pair<std::string, std::string>> binds;
        for (;;) {
            const protocol::Message message = channel.receive(kRestoreTimeoutMs);
            if (const auto* file = std::get_if<protocol::File>(&message)) {
                if (file->name.empty() || file->name.find('/') != std::string::npos ||
                    file->name.find('\0') != std::string::npos || file->name == "." || file->name == "..")
                    throw Error("bad image name '" + file->name + "'", ExitCode::bad_input);
                channel.receive_file(dir + "/images/" + file->name, file->size);
            } else if (const auto* snapshot = std::get_if<protocol::Snapshot>(&message)) {
                binds.push_back(receive_snapshot(channel, dir, *snapshot));
            } else if (std::holds_alternative<protocol::Restore>(message)) {
                break;
            } else if (std::holds_alternative<protocol::Abort>(message)) {
                say("clone " + name + ": the checkpoint failed on production's host; dropped");
                return;
            } else {
                throw Error(std::string("unexpected '") + protocol::type_name(message) + "' while receiving a clone",
                            ExitCode::bad_input);
            }
        }
        wait_for_exit(partial.page_server, "CRIU's page server");
        partial.page_server = -1;

        KeeperPlan plan{criu_.path, dir + "/images", dir + "/restore.log", binds, shell_job, name,
                        dir + "/images-mount", -1, {}, false, {}};
        const double started = now_ms();
        const pid_t keeper = start_keeper(plan, "/proc/self/ns/net");
        const double restore_ms = now_ms() - started;
        const std::string keeper_started = start_time(keeper);
        const pid_t clone_pid = find_clone_root(keeper, source);
        if (clone_pid < 0) {
            kill_keeper(keeper, keeper_started);
            throw Error("CRIU reported success but the clone's root process is not running; see " + plan.restore_log);
        }
        clones_[name] = {dir, keeper, keeper_started};
        partial.armed = false;
        // For `iprobe clone --list` on this host: what the agent holds.
        write_json(dir + "/clone.json", [&](JsonWriter& j) {
            j.field("name", name).field("clone_pid", clone_pid).field("keeper_pid", keeper);
            j.field("keeper_start", keeper_started).field("source_pid", source).field("restore_ms", restore_ms);
        });
        say("clone " + name + ": restored as PID " + std::to_string(clone_pid) + " in " + fmt_ms(restore_ms) + " ms");
        // Until the asker says it recorded the clone, the connection is the
        // clone's lifeline: closed (the asker killed, its host gone) or
        // silent for 30 s, the clone is destroyed, never left unrecorded.
        try {
            channel.send(protocol::Restored{clone_pid, keeper, static_cast<std::uint64_t>(restore_ms * 1e3)});
            if (std::holds_alternative<protocol::Keep>(channel.receive())) {
                channel.send(protocol::Kept{});
                return;
            }
            drop_clone(name, "the asker sent no 'keep'");
        } catch (const Error& e) {
            drop_clone(name, e.what());
        }
    }

    // A clone whose asker went away before keeping it.
    void drop_clone(const std::string& name, const std::string& why) {
        const auto it = clones_.find(name);
        if (it == clones_.end()) return;
        kill_keeper(it->second.keeper, it->second.keeper_started);
        remove_tree(it->second.dir);
        clones_.erase(it);
        say("clone " + name + " destroyed: its asker went away before keeping it (" + why + ")");
    }

    // A tar of one snapshot, unpacked beside the others and bound over the
    // original path inside the clone's mount namespace.
    std::pair<std::string, std::string> receive_snapshot(Channel& channel, const std::string& dir,
                                                         const protocol::Snapshot& snapshot) {
        const std::string& original = snapshot.path;
        if (original.empty() || original[0] != '/' || original.find("/../") != std::string::npos ||
            original.find('\0') != std::string::npos)
            throw Error("bad snapshot path '" + original + "'", ExitCode::bad_input);
        // Bound over `original` inside the clone, it would hide the images
        // being restored.
        const std::string state = fs::weakly_canonical(options_.state_dir).string() + "/";
        if (state.rfind(original + "/", 0) == 0 || original == "/")
            throw Error("the clone needs a private copy of " + original + ", which holds this agent's --state-dir " +
                            options_.state_dir + "; start the agent with a --state-dir outside it",
                        ExitCode::bad_input);
        const std::string into = dir + "/fs/" + std::to_string(snapshot.index);
        fs::create_directories(into);
        const std::string tar = into + ".tar";
        channel.receive_file(tar, snapshot.size);
        run_checked({"tar", "-xpf", tar, "-C", into}, "unpacking the snapshot of " + original);
        fs::remove(tar);
        return {into + "/" + fs::path(original).filename().string(), original};
    }

    void destroy_clone(Channel& channel, const std::string& name) {
        const auto it = clones_.find(name);
        if (it == clones_.end()) throw Error("this agent holds no clone named '" + name + "'", ExitCode::not_found);
        kill_keeper(it->second.keeper, it->second.keeper_started);
        remove_tree(it->second.dir);
        clones_.erase(it);
        say("clone " + name + " destroyed");
        channel.send(protocol::Destroyed{});
    }

    // The page server ends once the dump has sent its last page.
    static void wait_for_exit(pid_t pid, const std::string& what) {
        for (int i = 0; i < 6000 && ::kill(pid, 0) == 0; i++) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        if (::kill(pid, 0) == 0) {
            ::kill(pid, SIGKILL);
            throw Error(what + " was still receiving 60 s after the checkpoint ended");
        }
    }

    const AgentOptions& options_;
    Criu criu_;
    std::map<std::string, AgentClone> clones_;
};

}  // namespace

void run_clone_agent(const AgentOptions& o) {
    require_root("iprobe clone-agent");
    Criu criu = find_criu();
    const proxy::Endpoint at = proxy::parse_endpoint(o.listen, "--listen");
    if (o.state_dir.empty()) throw Error("--state-dir is required", ExitCode::usage);
    fs::create_directories(o.state_dir);
    // The keeper mounts a private /dev/shm for each clone, over the images.
    if (under(fs::weakly_canonical(o.state_dir).string(), "/dev/shm"))
        throw Error("--state-dir " + o.state_dir + " lies in /dev/shm, which each clone gets a private one of (its "
                    "images would be hidden from the restore); use a directory elsewhere",
                    ExitCode::usage);
    // The keeper gives each clone a private /run/iprobe over this directory.
    fs::create_directories("/run/iprobe");
    UniqueFd listener = proxy::listen_on(at, "--listen");
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    ::sigprocmask(SIG_BLOCK, &stop, nullptr);
    UniqueFd signals(::signalfd(-1, &stop, SFD_CLOEXEC));
    if (!signals) throw_errno("signalfd");
    Agent agent(o, criu);
    const std::string address = host_of(proxy::local_endpoint(listener.get()));
    const AgentRegistration registration(proxy::local_endpoint(listener.get()).str(), o.state_dir);
    if (o.progress) o.progress("listening on " + proxy::local_endpoint(listener.get()).str() + ", CRIU " + criu.version);
    for (;;) {
        pollfd fds[2] = {{listener.get(), POLLIN, 0}, {signals.get(), POLLIN, 0}};
        if (::poll(fds, 2, -1) < 0) {
            if (errno == EINTR) continue;
            throw_errno("poll");
        }
        if (fds[1].revents) break;
        UniqueFd client(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
        if (!client) continue;
        ::fcntl(client.get(), F_SETFL, ::fcntl(client.get(), F_GETFL) & ~O_NONBLOCK);
        Channel channel(std::move(client));
        try {
            agent.serve(channel, address);
        } catch (const Error& e) {
            if (o.progress) o.progress(std::string("request failed: ") + e.what());
            try {
                channel.send(protocol::Failure{static_cast<int>(e.code()), e.what()});
            } catch (const Error&) {
            }
        } catch (const std::exception& e) {
            if (o.progress) o.progress(std::string("request failed: ") + e.what());
        }
    }
}

CloneResult clone_to_agent(const CloneOptions& o, const std::string& agent) {
    const double t0 = now_ms();
    require_user_process(o.pid);
    const std::string name = checked_clone_name(o, "iprobe clone --to");
    const Criu criu = find_criu();
    const proxy::Endpoint at = proxy::parse_endpoint(agent, "--to");
    const std::vector<pid_t> tree = process_tree(o.pid);
    require_visible_session_leaders(tree);
    require_no_terminal(tree);
    const std::vector<std::string> snapshots = snapshot_paths(o, tree);

    // Killed outright (SIGKILL), this command leaves nothing here: its
    // guardian waits for CRIU, then removes the scratch images and the
    // record; the agent drops the clone when this connection closes unkept.
    CloneGuardian guardian;
    // The name is this command's until it returns (name_claim.h): the
    // scratch images and the note below are by name.
    const NameClaim claim(name, "remote", &guardian);
    if (const auto noted = read_json(remote_record(name)); noted.is_object())
        throw Error("a remote clone named '" + name + "' exists (on the agent at " + noted.value("agent", "?") +
                        "); remove it with `iprobe clone --destroy " + name + "` or pick another --netns name",
                    ExitCode::busy);
    Channel channel(connect_to(at, agent));
    bool shell_job = session_of(o.pid) != o.pid;
    channel.send(protocol::Clone{name, shell_job, o.pid});
    const int port = expect_reply<protocol::PageServerReady>(channel, kIoTimeoutMs).port;
    test_pause("page-server");

    // Only the images CRIU keeps local (a few hundred KB at most) pass
    // through here; the memory goes to the page server directly.
    const std::string work = (fs::is_directory("/dev/shm") ? std::string("/dev/shm") : fs::temp_directory_path().string()) +
                             "/iprobe-remote-" + name;
    guardian.guard_scratch(work);
    remove_tree(work);
    fs::create_directories(work + "/images");
    struct RemoveWork {
        std::string dir;
        ~RemoveWork() { remove_tree(dir); }
    } remove_work{work};

    progress(o, "memory goes to the page server at " + host_of(at) + ":" + std::to_string(port));
    Dumped dumped;
    std::unique_ptr<ClientPinger> client;  // production as one of its clients sees the checkpoint
    try {
        if (port <= 0 || port > 65535)
            throw Error("bad page server port " + std::to_string(port) + " in the clone protocol", ExitCode::bad_input);
        const UniqueFd page_server = connect_page_server(o.pid, with_port(at, port));
        const CorkedTailPusher pusher(page_server.get());
        if (o.client_view) client = ClientPinger::watch(o.pid);
        dumped = dump_production(o, criu, name, tree.size(), work + "/images", work + "/dump.log", shell_job,
                                 page_server.get());
    } catch (const Error&) {
        try {
            channel.send(protocol::Abort{});
        } catch (const Error&) {
        }
        throw;
    }
    const double client_seen_ms = client ? client->window_max_us() / 1e3 : -1;
    client.reset();
    const DumpStats& stats = dumped.stats;
    progress(o, "production could not answer for " +
                    fmt_ms(static_cast<double>(stats.freezing_us + stats.frozen_us) / 1e3) + " ms (stopping it " +
                    fmt_ms(static_cast<double>(stats.freezing_us) / 1e3) + " ms, frozen " +
                    fmt_ms(static_cast<double>(stats.frozen_us) / 1e3) + " ms)");

    test_pause("images");
    for (const auto& entry : fs::directory_iterator(work + "/images"))
        if (entry.is_regular_file()) channel.send_file(protocol::File{entry.path().filename().string(), 0}, entry.path().string());
    for (std::size_t i = 0; i < snapshots.size(); i++) {
        const fs::path original(snapshots[i]);
        const std::string tar = work + "/snapshot.tar";
        run_checked({"tar", "-cpf", tar, "-C", original.parent_path().string(), original.filename().string()},
                    "packing " + snapshots[i] + " for the clone");
        channel.send_file(protocol::Snapshot{i, snapshots[i], 0}, tar);
        fs::remove(tar);
    }
    progress(o, "restoring the clone on " + agent);
    channel.send(protocol::Restore{});
    const auto restored = expect_reply<protocol::Restored>(channel, kRestoreTimeoutMs);
    test_pause("restored");

    CloneResult r;
    r.name = name;
    r.netns_path = "agent " + agent;
    r.clone_pid = restored.clone_pid;
    r.clone_pid_in_ns = o.pid;
    r.keeper_pid = restored.keeper_pid;
    r.freeze_ms = static_cast<double>(stats.frozen_us) / 1e3;
    r.freezing_ms = static_cast<double>(stats.freezing_us) / 1e3;
    r.dump_ms = dumped.dump_ms;
    r.restore_ms = static_cast<double>(restored.restore_us) / 1e3;
    r.pages_written = stats.pages_written;
    r.snapshots = snapshots;
    r.client_seen_ms = client_seen_ms;
    r.total_ms = now_ms() - t0;
    // Recorded, then kept: killed in between, the guardian removes the
    // record and the agent the clone.
    guardian.guard_scratch(remote_record(name));
    record_remote_clone(r, agent);
    test_pause("record");
    try {
        channel.send(protocol::Keep{});
        expect_reply<protocol::Kept>(channel, kIoTimeoutMs);
    } catch (const Error&) {
        forget_remote_clone(name);
        throw;
    }
    guardian.release();
    return r;
}

void destroy_agent_clone(const std::string& agent, const std::string& name) {
    validate_name(name);
    const proxy::Endpoint at = proxy::parse_endpoint(agent, "--to");
    Channel channel(connect_to(at, agent));
    channel.send(protocol::Destroy{name});
    expect_reply<protocol::Destroyed>(channel, kIoTimeoutMs);
    forget_remote_clone(name);
}

void record_remote_clone(const CloneResult& r, const std::string& agent) {
    fs::create_directories(kRemoteRoot);
    write_json(remote_record(r.name), [&](JsonWriter& j) {
        j.field("agent", agent).field("clone_pid", r.clone_pid).field("keeper_pid", r.keeper_pid);
        j.field("freeze_ms", r.freeze_ms).field("freezing_ms", r.freezing_ms).field("dump_ms", r.dump_ms);
        j.field("restore_ms", r.restore_ms).field("total_ms", r.total_ms);
    });
}

void forget_remote_clone(const std::string& name) {
    std::error_code ec;
    fs::remove(remote_record(name), ec);
}

std::vector<RemoteCloneRecord> remote_clones() {
    std::vector<RemoteCloneRecord> out;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(kRemoteRoot, ec)) {
        const auto doc = read_json(e.path());
        if (!doc.is_object()) continue;
        RemoteCloneRecord r;
        r.agent = doc.value("agent", "");
        r.clone.name = e.path().filename().string();
        r.clone.netns_path = "agent " + r.agent;
        r.clone.clone_pid = doc.value("clone_pid", -1);
        r.clone.keeper_pid = doc.value("keeper_pid", -1);
        r.clone.freeze_ms = doc.value("freeze_ms", 0.0);
        r.clone.freezing_ms = doc.value("freezing_ms", 0.0);
        r.clone.dump_ms = doc.value("dump_ms", 0.0);
        r.clone.restore_ms = doc.value("restore_ms", 0.0);
        r.clone.total_ms = doc.value("total_ms", 0.0);
        out.push_back(std::move(r));
    }
    return out;
}

std::vector<AgentHeldClone> agent_held_clones() {
    std::vector<AgentHeldClone> out;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(kAgentRoot, ec)) {
        const auto agent = read_json(e.path());
        if (!agent.is_object() || !still_running(agent.value("pid", -1), agent.value("start", ""))) continue;
        for (const auto& dir : fs::directory_iterator(agent.value("state_dir", ""), ec)) {
            const auto doc = read_json(dir.path() / "clone.json");
            if (!doc.is_object()) continue;
            AgentHeldClone c;
            c.agent = agent.value("listen", "");
            c.state_dir = dir.path().string();
            c.clone.name = doc.value("name", "");
            c.clone.netns_path = "held by the agent on " + c.agent;
            c.clone.clone_pid = doc.value("clone_pid", -1);
            c.clone.clone_pid_in_ns = doc.value("source_pid", -1);
            c.clone.keeper_pid = still_running(doc.value("keeper_pid", -1), doc.value("keeper_start", ""))
                                     ? doc.value("keeper_pid", -1)
                                     : -1;
            c.clone.restore_ms = doc.value("restore_ms", 0.0);
            c.clone.total_ms = c.clone.restore_ms;
            out.push_back(std::move(c));
        }
    }
    return out;
}

}  // namespace iprobe::launcher
