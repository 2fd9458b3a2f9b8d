#include "iprobe/launcher/debug.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "iprobe/hotpatch/attach_report.h"
#include "iprobe/launcher/clone.h"
#include "iprobe/launcher/container.h"
#include "iprobe/proxy/address.h"
#include "iprobe/proxy/mirror.h"
#include "iprobe/proxy/stats.h"
#include "iprobe/support/error.h"
#include "iprobe/support/fd.h"
#include "iprobe/support/install_layout.h"
#include "iprobe/support/json.h"
#include "mirror_command.h"
#include "netns.h"
#include "process.h"

namespace fs = std::filesystem;

namespace iprobe::launcher {
namespace {

std::string libexec_tool(const std::string& name) {
    const auto& layout = InstallLayout::current();
    if (auto tool = layout.helper(name)) return tool->string();
    throw Error("iprobe debug needs " + name + " in " + layout.libexec().string() +
                    " (build it: cmake --build BUILD --target " + name + ")",
                ExitCode::unavailable);
}

int port_of(const std::string& addr, const char* what) { return proxy::parse_endpoint(addr, what).port(); }

// A /30 in 10.213.0.0/16 that no interface here uses: .1 host, .2 clone.
int pick_subnet() {
    std::set<int> used;
    const auto links = nlohmann::json::parse(run({"ip", "-j", "-4", "addr", "show"}).out, nullptr, false);
    if (!links.is_array()) throw Error("`ip -j addr show` gave no interface list; is iproute2 installed?");
    for (const auto& link : links)
        for (const auto& a : link.is_object() ? link.value("addr_info", nlohmann::json::array()) : nlohmann::json::array()) {
            if (!a.is_object()) continue;
            in_addr ip{};
            if (::inet_pton(AF_INET, a.value("local", "").c_str(), &ip) != 1) continue;
            const std::uint32_t host = ntohl(ip.s_addr);
            if ((host >> 16) == ((10u << 8) | 213u)) used.insert(static_cast<int>((host & 0xffff) / 4));
        }
    for (int i = static_cast<int>(getpid()) % 16000; i < 16000 + static_cast<int>(getpid()) % 16000; ++i)
        if (!used.count(i % 16000)) return i % 16000;
    throw Error("no free 10.213.0.0/16 subnet for the clone's veth");
}

std::string subnet_addr(int subnet, int host) {
    return "10.213." + std::to_string(subnet / 64) + "." + std::to_string((subnet % 64) * 4 + host);
}

// The mirror's counters; nullopt while it does not answer.
std::optional<proxy::MirrorStats> mirror_stats(const proxy::Endpoint& at) {
    const auto doc = proxy::fetch_mirror_stats(at, std::chrono::seconds(2));
    if (!doc) return std::nullopt;
    return proxy::parse_mirror_stats(*doc);
}

// The reply protocol of a service we know by its program, for divergence
// checking by message; empty when unknown.
std::string protocol_of_service(pid_t pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/comm");
    std::string comm;
    std::getline(in, comm);
    for (const char* resp : {"redis-server", "keydb-server", "valkey-server", "redis-check-aof"})
        if (comm == resp) return "resp";
    for (const char* http : {"nginx", "httpd", "apache2", "lighttpd", "caddy", "h2o", "varnishd"})
        if (comm == http) return "http";
    return {};
}

class DebugSession {
public:
    explicit DebugSession(DebugOptions o) : o_(std::move(o)) {
        name_ = !o_.name.empty()          ? o_.name
                : o_.container.empty() ? "iprobe-debug-" + std::to_string(o_.pid)
                                       : "iprobe-debug-" + o_.container;
        port_ = port_of(o_.production, "--production");
        service_ip_ = o_.production.substr(0, o_.production.rfind(':'));
        if (service_ip_.empty() || service_ip_ == "0.0.0.0" || service_ip_ == "*" || service_ip_ == "localhost")
            service_ip_ = "127.0.0.1";
        in_addr probe{};
        if (inet_pton(AF_INET, service_ip_.c_str(), &probe) != 1)
            throw Error("--production wants an IPv4 ADDR:PORT, got '" + o_.production + "'", ExitCode::usage);
        if (!o_.capture) port_of(o_.listen, "--listen");
        mirror_tool_ = libexec_tool("iprobe-mirror");
        if (!o_.probes.empty() || !o_.functions.empty()) hotpatch_tool_ = libexec_tool("iprobe-hotpatch");
        subnet_ = pick_subnet();
        // Short and unique per session: interface names stop at 15 bytes.
        veth_ = "ipd" + std::to_string(getpid());
        int lifeline[2];
        if (::pipe2(lifeline, O_CLOEXEC) < 0) throw_errno("pipe");
        lifeline_read_.reset(lifeline[0]);
        lifeline_write_.reset(lifeline[1]);
    }
    ~DebugSession() { teardown(); }

    int run();

private:
    void event(const std::string& what, const std::string& human,
               const std::function<void(JsonWriter&)>& fields = {}) {
        if (o_.json) {
            JsonWriter w;
            w.begin_object().field("event", what);
            if (fields) fields(w);
            w.end_object();
            std::printf("%s\n", w.str().c_str());
            std::fflush(stdout);
        } else {
            std::fprintf(stderr, "iprobe debug: %s\n", human.c_str());
        }
    }
    void make_clone();
    void connect_clone();
    void attach_probes();
    void drop_clone();
    void start_mirror();
    void teardown();
    void stop_child(pid_t& pid, int sig, bool group = false);
    void relay_trace(bool drain);
    std::string divergence_mode() const;

    DebugOptions o_;
    std::string name_, veth_, mirror_tool_, hotpatch_tool_;
    std::string service_ip_;  // production's listening address, as the clone has it too
    int port_ = 0, subnet_ = 0, stats_port_ = 0;
    proxy::Endpoint stats_at_;  // the mirror's, as it reported when ready
    bool have_clone_ = false;
    CloneResult clone_;
    ContainerCloneResult container_clone_;  // --container: the clone is a podman container
    std::string debug_address_;             // where the mirror sends the copy: the clone's service
    pid_t mirror_ = -1, trace_ = -1;
    UniqueFd mirror_out_;
    UniqueFd trace_out_;         // --json: the clone's JSON trace, relayed as "trace" events
    std::string trace_partial_;  // its last incomplete line
    // Only this process holds the write end (close-on-exec: not the mirror
    // or the tracer): if it is killed, even with SIGKILL, the clone ends.
    UniqueFd lifeline_read_, lifeline_write_;
    int clones_made_ = 0;
};

void DebugSession::make_clone() {
    if (!o_.container.empty()) {
        ContainerCloneOptions co{o_.container, name_, [this](const std::string& line) {
                                     if (!o_.json) std::fprintf(stderr, "iprobe debug: %s\n", line.c_str());
                                 }};
        container_clone_ = clone_container(co);
        have_clone_ = true;
        ++clones_made_;
        debug_address_ = container_clone_.address + ":" + std::to_string(port_);
        event("clone",
              "clone " + name_ + " running: container " + container_clone_.id.substr(0, 12) + ", PID " +
                  std::to_string(container_clone_.clone_pid) + ", reachable at " + debug_address_,
              [&](JsonWriter& w) {
                  w.field("name", name_)
                      .field("container_id", container_clone_.id)
                      .field("clone_pid", static_cast<std::int64_t>(container_clone_.clone_pid))
                      .field("debug_address", debug_address_)
                      .field("freeze_us", static_cast<std::int64_t>(container_clone_.freeze_ms * 1e3))
                      .field("total_us", static_cast<std::int64_t>(container_clone_.total_ms * 1e3))
                      .field("generation", clones_made_);
              });
        if (!o_.probes.empty() || !o_.functions.empty()) attach_probes();
        return;
    }
    CloneOptions co;
    co.pid = o_.pid;
    co.name = name_;
    co.lifeline_fd = lifeline_read_.get();
    co.progress = [this](const std::string& line) {
        if (!o_.json) std::fprintf(stderr, "iprobe debug: %s\n", line.c_str());
    };
    clone_ = clone_process(co);
    have_clone_ = true;
    ++clones_made_;
    const std::string clone_ip = subnet_addr(subnet_, 2);
    debug_address_ = clone_ip + ":" + std::to_string(port_);
    connect_clone();
    event("clone",
          "clone " + name_ + " running as PID " + std::to_string(clone_.clone_pid) + " (PID " +
              std::to_string(clone_.clone_pid_in_ns) + " inside its namespace), reachable at " + clone_ip + ":" +
              std::to_string(port_),
          [&](JsonWriter& w) {
              w.field("name", name_)
                  .field("clone_pid", static_cast<std::int64_t>(clone_.clone_pid))
                  .field("netns", clone_.netns_path)
                  .field("debug_address", clone_ip + ":" + std::to_string(port_))
                  .field("freeze_us", static_cast<std::int64_t>(clone_.freeze_ms * 1e3))
                  .field("total_us", static_cast<std::int64_t>(clone_.total_ms * 1e3))
                  .field("generation", clones_made_);
          });
    if (!o_.probes.empty() || !o_.functions.empty()) attach_probes();
}

// The veth pair between here and the clone, and the NAT inside the clone
// that lets the mirror reach the service where it listens.
void DebugSession::connect_clone() {
    const std::string host_ip = subnet_addr(subnet_, 1), clone_ip = subnet_addr(subnet_, 2);
    create_veth(name_, veth_, host_ip + "/30", clone_ip + "/30");
    record_clone_veth(name_, veth_);
    const std::string ns = "--net=" + clone_.netns_path;
    const std::string target = service_ip_;
    const bool loopback = target.rfind("127.", 0) == 0;
    if (loopback)
        run_checked({"nsenter", ns, "sysctl", "-q", "-w", "net.ipv4.conf.eth0.route_localnet=1"},
                    "allowing loopback forwarding in the clone");
    // Forward what arrives on the veth to the address the service listens
    // on inside the clone (production's own, see clone_process) ...
    run_checked({"nsenter", ns, "iptables", "-t", "nat", "-A", "PREROUTING", "-i", "eth0", "-p", "tcp", "--dport",
                 std::to_string(port_), "-j", "DNAT", "--to-destination", target + ":" + std::to_string(port_)},
                "forwarding the clone's port to the service address");
    // ... and make the mirror's connections look local there too, or a
    // service that trusts only loopback (redis' protected mode) refuses them.
    if (loopback)
        run_checked({"nsenter", ns, "iptables", "-t", "nat", "-A", "INPUT", "-p", "tcp", "-s", host_ip, "-d", target,
                     "--dport", std::to_string(port_), "-j", "SNAT", "--to-source", "127.0.0.1"},
                    "making the mirror's connections local in the clone");
}

void DebugSession::attach_probes() {
    // A CRIU clone: the probe tools run inside its PID and mount namespaces,
    // where it has production's PID and its own /dev/shm and /run/iprobe.  A
    // container clone: they run here, on its host PID (attach puts the
    // runtime inside the container's file system for its dlopen).
    const bool container = !o_.container.empty();
    const pid_t clone_pid = container ? container_clone_.clone_pid : clone_.clone_pid;
    const std::vector<std::string> in_clone =
        container ? std::vector<std::string>{hotpatch_tool_}
                  : std::vector<std::string>{"nsenter", "--target", std::to_string(clone_.keeper_pid), "--pid",
                                             "--mount", "--", hotpatch_tool_};
    const std::string pid_in_clone = std::to_string(container ? clone_pid : clone_.clone_pid_in_ns);
    std::vector<std::string> attach = in_clone;
    attach.insert(attach.end(), {"attach", pid_in_clone, "--json"});
    if (!o_.probes.empty()) {
        attach.push_back("--probes");
        attach.push_back(o_.probes);
    }
    if (!o_.functions.empty()) {
        attach.push_back("--functions");
        attach.push_back(o_.functions);
    }
    RunResult a = launcher::run(attach);
    if (!a.ok())
        throw Error("iprobe attach in clone " + name_ + " (PID " + std::to_string(clone_pid) + ") failed: " + a.err);
    // The tool ran inside the clone's PID namespace: its PID there means nothing here.
    const std::string summary = hotpatch::attach_summary(hotpatch::parse_attach_json(a.out));
    event("attached",
          "probes attached in clone " + name_ + " (PID " + std::to_string(clone_pid) + "): " + summary,
          [&](JsonWriter& w) { w.field("clone_pid", static_cast<std::int64_t>(clone_pid)); });
    // Line-buffered so the trace streams through a pipe or file as it comes.
    std::vector<std::string> trace;
    if (!find_program("stdbuf").empty()) trace = {"stdbuf", "-oL"};
    trace.insert(trace.end(), in_clone.begin(), in_clone.end());
    trace.insert(trace.end(), {"trace", pid_in_clone});
    if (!o_.json) {
        trace_ = spawn(trace, 1, 2, true);
        return;
    }
    trace.insert(trace.end(), {"--format", "json"});
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) < 0) throw_errno("pipe");
    UniqueFd rd(fds[0]), wr(fds[1]);
    trace_ = spawn(trace, wr.get(), 2, true);
    trace_out_ = std::move(rd);
    trace_partial_.clear();
}

// Each JSON line of the clone's trace becomes a "trace" event of ours, so
// stdout stays one kind of JSON line.
void DebugSession::relay_trace(bool drain) {
    if (!trace_out_) return;
    char buf[65536];
    for (;;) {
        if (!drain) {
            pollfd p{trace_out_.get(), POLLIN, 0};
            if (::poll(&p, 1, 0) <= 0) return;
        }
        const ssize_t n = ::read(trace_out_.get(), buf, sizeof buf);
        if (n <= 0) {
            trace_out_.reset();
            return;
        }
        trace_partial_.append(buf, static_cast<size_t>(n));
        std::string out;
        std::size_t start = 0;
        for (std::size_t nl; (nl = trace_partial_.find('\n', start)) != std::string::npos; start = nl + 1) {
            const std::string_view line(trace_partial_.data() + start, nl - start);
            if (line.size() < 2 || line.front() != '{') continue;
            out += "{\"event\":\"trace\",";
            out += line.substr(1);
            out += '\n';
        }
        trace_partial_.erase(0, start);
        std::fwrite(out.data(), 1, out.size(), stdout);
        std::fflush(stdout);
        if (!drain && static_cast<std::size_t>(n) < sizeof buf) return;
    }
}

void DebugSession::stop_child(pid_t& pid, int sig, bool group) {
    if (pid <= 0) return;
    ::kill(group ? -pid : pid, sig);
    int status;
    for (int i = 0; i < 300; ++i) {
        if (::waitpid(pid, &status, WNOHANG) == pid) {
            pid = -1;
            return;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ::kill(group ? -pid : pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    pid = -1;
}

void DebugSession::drop_clone() {
    stop_child(trace_, SIGINT, true);
    relay_trace(true);
    if (have_clone_) {
        try {
            if (o_.container.empty()) destroy_clone(name_);
            else destroy_container_clone(name_);
        } catch (const Error& e) {
            std::fprintf(stderr, "iprobe debug: removing clone %s: %s\n", name_.c_str(), e.what());
        }
        have_clone_ = false;
    }
}

// The mirror's stdout (a pipe relayed to our stderr) tells people what it
// does; its readiness, and where its stats are, come on fd 3 as one JSON event.
void DebugSession::start_mirror() {
    int out[2], ready[2];
    if (::pipe2(out, O_CLOEXEC) < 0 || ::pipe2(ready, O_CLOEXEC) < 0) throw_errno("pipe");
    UniqueFd out_rd(out[0]), out_wr(out[1]), ready_rd(ready[0]), ready_wr(ready[1]);
    const std::string divergence = divergence_mode();
    const MirrorCommand command =
        mirror_command(o_, mirror_tool_, debug_address_, port_, divergence, protocol_of_service(o_.pid));
    mirror_ = spawn(command.argv, out_wr.get(), 2, false, ready_wr.get());
    out_wr.reset();
    ready_wr.reset();
    std::string event_line;
    const auto deadline = now_ms() + 10000;
    while (event_line.find('\n') == std::string::npos) {
        pollfd p{ready_rd.get(), POLLIN, 0};
        const int left = static_cast<int>(deadline - now_ms());
        if (left <= 0 || ::poll(&p, 1, left) <= 0) throw Error("iprobe mirror did not report ready within 10 s");
        char buf[512];
        const ssize_t n = ::read(ready_rd.get(), buf, sizeof buf);
        if (n <= 0) {
            int status = 0;
            ::waitpid(mirror_, &status, 0);
            mirror_ = -1;
            const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
            throw Error("iprobe mirror exited before it was ready (see its message above)",
                        code > 0 && code <= 7 ? static_cast<ExitCode>(code) : ExitCode::failure);
        }
        event_line.append(buf, static_cast<size_t>(n));
    }
    const proxy::MirrorReady ready_event = proxy::parse_ready_event(event_line.substr(0, event_line.find('\n')));
    if (!ready_event.stats) throw Error("iprobe mirror reported no stats endpoint");
    stats_at_ = *ready_event.stats;
    stats_port_ = stats_at_.port();
    mirror_out_ = std::move(out_rd);
    const std::string stats = "127.0.0.1:" + std::to_string(stats_port_);
    event("mirror", mirror_summary(o_, command, divergence, "http://" + stats + "/"), [&](JsonWriter& w) {
        mirror_event_fields(w, o_, command);
        w.field("stats_port", stats_port_).field("stats", "http://" + stats + "/").field("divergence", divergence);
    });
}

std::string DebugSession::divergence_mode() const {
    if (o_.divergence != "auto") return o_.divergence;
    if (std::string known = protocol_of_service(o_.pid); !known.empty()) return known;
    return o_.recloning == DebugOptions::Recloning::on_divergence ? "stream" : "off";
}

void DebugSession::teardown() {
    drop_clone();
    stop_child(mirror_, SIGTERM);
}

int DebugSession::run() {
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGCHLD);
    sigprocmask(SIG_BLOCK, &mask, nullptr);
    UniqueFd sigfd(::signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK));

    // Clone first so the mirror's debug side exists when clients come.
    make_clone();
    start_mirror();
    double last_clone = now_ms();
    long long overflows_seen = 0, diverged_seen = 0;
    int exit_code = 0;
    for (;;) {
        pollfd p[3] = {{sigfd.get(), POLLIN, 0}, {mirror_out_.get(), POLLIN, 0}, {trace_out_.get(), POLLIN, 0}};
        ::poll(p, trace_out_ ? 3 : 2, 1000);
        if (trace_out_ && p[2].revents) relay_trace(false);
        if (p[1].revents) {
            char buf[512];
            ssize_t n = ::read(mirror_out_.get(), buf, sizeof buf);
            if (n > 0 && !o_.json) (void)!::write(2, buf, static_cast<size_t>(n));
            if (n == 0) mirror_out_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
        }
        bool stop = false;
        signalfd_siginfo si;
        while (::read(sigfd.get(), &si, sizeof si) == sizeof si) {
            if (si.ssi_signo == SIGINT || si.ssi_signo == SIGTERM) stop = true;
        }
        int status;
        if (mirror_ > 0 && ::waitpid(mirror_, &status, WNOHANG) == mirror_) {
            mirror_ = -1;
            event("error", "the mirror exited; stopping");
            exit_code = 1;
            stop = true;
        }
        if (trace_ > 0 && ::waitpid(trace_, &status, WNOHANG) == trace_) trace_ = -1;
        if (stop) break;
        bool reclone = false;
        std::string why;
        if (o_.recloning == DebugOptions::Recloning::periodic && now_ms() - last_clone >= o_.period_s * 1000.0) {
            reclone = true;
            why = "periodic";
        } else if (o_.recloning == DebugOptions::Recloning::on_overflow) {
            // The clone missed requests: a copy's buffer overflowed, or the
            // capture lost a connection's bytes.
            const auto stats = mirror_stats(stats_at_);
            const long long overflows =
                stats ? static_cast<long long>(stats->buffer.overflows +
                                               (stats->capture ? stats->capture->lost_connections : 0))
                      : -1;
            if (overflows > overflows_seen) {
                overflows_seen = overflows;
                reclone = true;
                why = "a connection's debug buffer overflowed";
            }
        } else if (o_.recloning == DebugOptions::Recloning::on_divergence) {
            const auto stats = mirror_stats(stats_at_);
            const long long diverged = stats ? static_cast<long long>(stats->divergence.diverged_connections) : -1;
            if (diverged > diverged_seen) {
                diverged_seen = diverged;
                reclone = true;
                why = "the clone's replies diverged from production's";
            }
        }
        if (reclone) {
            event("reclone", "re-cloning (" + why + ")", [&](JsonWriter& w) { w.field("reason", why); });
            drop_clone();
            make_clone();
            last_clone = now_ms();
        }
    }
    // The trace ends first, so "stopping" is the session's last line.
    stop_child(trace_, SIGINT, true);
    relay_trace(true);
    // Relayed whole (with the open connections), as the mirror serves it.
    const auto final_stats = proxy::fetch_mirror_stats(stats_at_, std::chrono::seconds(2));
    event("stopping", "stopping: removing the clone and the mirror; production keeps running", [&](JsonWriter& w) {
        if (!final_stats) w.key("stats").null();
        else w.key("stats").raw(*final_stats);
    });
    teardown();
    return exit_code;
}

}  // namespace

int run_debug(const DebugOptions& options) {
    if (geteuid() != 0)
        throw Error("iprobe debug needs root (CRIU, namespaces, ptrace); run it with sudo", ExitCode::permission);
    DebugOptions o = options;
    if (!o.container.empty()) {
        // Not yet: a mirror that follows a re-cloned container to its new address.
        if (o.recloning != DebugOptions::Recloning::off)
            throw Error("--recloning with --container is not supported yet", ExitCode::usage);
        o.pid = container_main_pid(o.container);
    }
    if (o.pid <= 0 || !fs::exists("/proc/" + std::to_string(o.pid)))
        throw Error("no process with PID " + std::to_string(o.pid), ExitCode::not_found);
    DebugSession session(o);
    return session.run();
}

}  // namespace iprobe::launcher
