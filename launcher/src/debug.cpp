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

#include "iprobe/launcher/adapt_controller.h"
#include "clone_probes.h"
#include "iprobe/hotpatch/attach_report.h"
#include "iprobe/launcher/clone.h"
#include "iprobe/launcher/container.h"
#include "iprobe/launcher/retro.h"
#include "iprobe/proxy/address.h"
#include "iprobe/proxy/mirror.h"
#include "iprobe/proxy/stats.h"
#include "iprobe/support/error.h"
#include "iprobe/support/fd.h"
#include "iprobe/support/glob.h"
#include "iprobe/support/install_layout.h"
#include "iprobe/support/json.h"
#include "iprobe/support/proc.h"
#include "mirror_command.h"
#include "netns.h"
#include "probe_cost.h"
#include "process.h"
#include "session_events.h"
#include "session_report.h"

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

// /30s in 10.213.0.0/16 that no interface here uses: .1 host, .2 clone.
std::vector<int> pick_subnets(int count) {
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
    std::vector<int> out;
    for (int i = static_cast<int>(getpid()) % 16000; i < 16000 + static_cast<int>(getpid()) % 16000; ++i) {
        if (used.count(i % 16000)) continue;
        out.push_back(i % 16000);
        if (static_cast<int>(out.size()) == count) return out;
    }
    throw Error("no free 10.213.0.0/16 subnet for the clones' veths");
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

// The CPU share of a process's busiest thread between two samples: how
// much idle time a single-threaded service (or its busiest worker) has left.
class BusiestThread {
public:
    double sample(pid_t pid, double t_s) {
        std::map<pid_t, double> now;
        const double tick = static_cast<double>(::sysconf(_SC_CLK_TCK));
        for (pid_t tid : proc::threads(pid)) {
            const auto user = proc::stat_field(pid, 14, tid), sys = proc::stat_field(pid, 15, tid);
            if (user && sys) now[tid] = (std::stod(*user) + std::stod(*sys)) / tick;
        }
        double busiest = 0;
        if (last_t_ >= 0 && t_s > last_t_)
            for (const auto& [tid, cpu] : now)
                if (auto it = last_.find(tid); it != last_.end())
                    busiest = std::max(busiest, (cpu - it->second) / (t_s - last_t_));
        last_ = std::move(now);
        last_t_ = t_s;
        return std::min(busiest, 1.0);
    }

private:
    std::map<pid_t, double> last_;
    double last_t_ = -1;
};

std::string joined(const std::vector<std::string>& items, std::size_t max = SIZE_MAX) {
    std::string out;
    for (std::size_t i = 0; i < items.size() && i < max; ++i) out += (i ? ", " : "") + items[i];
    if (items.size() > max) out += ", ... (" + std::to_string(items.size() - max) + " more)";
    return out;
}

std::string percent(double share) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f%%", 100.0 * share);
    return buf;
}

// One clone of the current generation and what runs with it.
struct Clone {
    int index = 0;
    std::string name, veth, debug_address;
    int subnet = 0;
    bool alive = false;
    CloneResult clone;
    std::unique_ptr<CloneProbes> probes;
    std::vector<std::string> functions;  // symbols it probes (empty: the user's selector as given)
    std::unique_ptr<AdaptController> adapt;
    ProbeTimeline timeline;
    BusiestThread cpu;
    pid_t trace = -1;
    UniqueFd trace_out;          // its trace, relayed (JSON, or text with several clones)
    std::string trace_partial;   // its last incomplete line
};

class DebugSession {
public:
    explicit DebugSession(DebugOptions o) : o_(std::move(o)), events_(o_.json, "iprobe debug") {
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
        if (probing()) hotpatch_tool_ = libexec_tool("iprobe-hotpatch");
        clones_.resize(static_cast<std::size_t>(o_.clones));
        const std::vector<int> subnets = o_.container.empty() ? pick_subnets(o_.clones) : std::vector<int>{0};
        for (int i = 0; i < o_.clones; ++i) {
            Clone& c = clones_[static_cast<std::size_t>(i)];
            c.index = i;
            c.subnet = subnets[static_cast<std::size_t>(i)];
            c.name = i == 0 ? name_ : name_ + "-" + std::to_string(i + 1);
            // Short and unique per session: interface names stop at 15 bytes.
            c.veth = "ipd" + std::to_string(getpid()) + (i == 0 ? "" : "c" + std::to_string(i));
        }
        int lifeline[2];
        if (::pipe2(lifeline, O_CLOEXEC) < 0) throw_errno("pipe");
        lifeline_read_.reset(lifeline[0]);
        lifeline_write_.reset(lifeline[1]);
        started_ = std::chrono::steady_clock::now();
    }
    ~DebugSession() { teardown(); }

    int run();

private:
    bool probing() const { return !o_.probes.empty() || !o_.functions.empty(); }
    double now_s() const {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
    }
    void event(const std::string& what, const std::string& human,
               const std::function<void(JsonWriter&)>& fields = {}) const {
        events_(what, human, fields);
    }
    std::string clone_label(const Clone& c) const {
        return o_.clones > 1 ? "clone " + std::to_string(c.index + 1) + " (" + c.name + ")" : "clone " + c.name;
    }
    void prepare_probes();
    void make_generation();
    void make_container_clone();
    void connect_clone(Clone& c);
    void attach_probes(Clone& c, pid_t pid_in_clone, std::vector<std::string> in_clone);
    void drop_generation();
    void remove_clones();
    void report_generation();
    void start_mirror();
    void switch_recording(const std::string& path);
    void teardown();
    void stop_child(pid_t& pid, int sig, bool group = false);
    void relay_trace(Clone& c, bool drain);
    void adapt_tick();
    void trim_recording();
    std::string divergence_mode() const;
    std::vector<std::vector<std::string>> split_functions() const;

    DebugOptions o_;
    SessionEvents events_;
    std::string name_, mirror_tool_, hotpatch_tool_;
    std::string service_ip_;  // production's listening address, as the clone has it too
    int port_ = 0, stats_port_ = 0;
    proxy::Endpoint stats_at_;  // the mirror's, as it reported when ready
    std::vector<Clone> clones_;
    ContainerCloneResult container_clone_;  // --container: the clone is a podman container
    bool have_container_clone_ = false;
    pid_t mirror_ = -1;
    UniqueFd mirror_out_;
    UniqueFd mirror_control_;  // our end of the mirror's --control-fd socket
    // Only this process holds the write end (close-on-exec: not the mirror
    // or the tracer): if it is killed, even with SIGKILL, the clone ends.
    UniqueFd lifeline_read_, lifeline_write_;
    int generation_ = 0;
    double generation_start_s_ = 0;
    std::chrono::steady_clock::time_point started_;
    // --adapt and --clones: the selected functions by symbol, what one of
    // their events costs, and (after a generation) what each cost then.
    std::vector<std::string> probe_sources_;
    std::vector<std::string> functions_;
    ProbeCost cost_;
    std::map<std::string, double> measured_cost_;
    // --record
    std::unique_ptr<RecordRing> ring_;
    GenerationInfo recording_;
    bool recording_on_ = false;
    double last_trim_s_ = 0;
};

// With --adapt or --clones the functions are named one by one (to turn off
// and on, to split), so the selection is resolved here, from the same
// sources attach reads.
void DebugSession::prepare_probes() {
    if (!probing() || (!o_.adapt && o_.clones == 1)) return;
    probe_sources_ = split_list(o_.probes);
    if (probe_sources_.empty()) probe_sources_ = {fs::read_symlink("/proc/" + std::to_string(o_.pid) + "/exe").string()};
    functions_ = selected_functions(probe_sources_, split_list(o_.functions));
    if (functions_.empty())
        throw Error("no probed function matches --functions " + o_.functions + " in " + joined(probe_sources_),
                    ExitCode::not_found);
    cost_ = measure_probe_cost();
    event("probe-cost",
          "a probed call costs " + std::to_string(static_cast<int>(std::lround(cost_.entry_ns + cost_.exit_ns))) +
              " ns here (entry " + std::to_string(cost_.entry_ns) + " ns, exit " + std::to_string(cost_.exit_ns) +
              " ns, measured on iprobe-probe-cost); " + std::to_string(functions_.size()) + " functions selected",
          [&](JsonWriter& w) {
              w.field("entry_ns", cost_.entry_ns).field("exit_ns", cost_.exit_ns).field("unprobed_ns", cost_.unprobed_ns);
              w.field("functions", static_cast<std::uint64_t>(functions_.size()));
          });
}

// Each clone's share of the functions.  The first generation deals them
// out in list order; later ones balance what each cost in the previous
// generation (largest first, to the clone carrying least), so each clone
// carries about 1/N of the instrumentation.
std::vector<std::vector<std::string>> DebugSession::split_functions() const {
    std::vector<std::vector<std::string>> shares(clones_.size());
    if (functions_.empty()) return shares;
    if (clones_.size() == 1 || measured_cost_.empty()) {
        for (std::size_t i = 0; i < functions_.size(); ++i) shares[i % shares.size()].push_back(functions_[i]);
        return shares;
    }
    std::vector<std::size_t> order(functions_.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    auto cost_of = [&](std::size_t i) {
        auto it = measured_cost_.find(functions_[i]);
        return it == measured_cost_.end() ? 0.0 : it->second;
    };
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return cost_of(a) > cost_of(b); });
    std::vector<double> load(shares.size(), 0);
    for (std::size_t i : order) {
        const auto least = static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
        shares[least].push_back(functions_[i]);
        load[least] += cost_of(i);
    }
    return shares;
}

void DebugSession::make_container_clone() {
    Clone& c = clones_.front();
    ContainerCloneOptions co{o_.container, name_, [this](const std::string& line) {
                                 if (!o_.json) std::fprintf(stderr, "iprobe debug: %s\n", line.c_str());
                             }};
    container_clone_ = clone_container(co);
    have_container_clone_ = true;
    c.alive = true;
    c.debug_address = container_clone_.address + ":" + std::to_string(port_);
    event("clone",
          "clone " + name_ + " running: container " + container_clone_.id.substr(0, 12) + ", PID " +
              std::to_string(container_clone_.clone_pid) + ", reachable at " + c.debug_address,
          [&](JsonWriter& w) {
              w.field("name", name_)
                  .field("container_id", container_clone_.id)
                  .field("clone_pid", static_cast<std::int64_t>(container_clone_.clone_pid))
                  .field("debug_address", c.debug_address)
                  .field("freeze_us", static_cast<std::int64_t>(container_clone_.freeze_ms * 1e3))
                  .field("total_us", static_cast<std::int64_t>(container_clone_.total_ms * 1e3))
                  .field("generation", generation_);
          });
    // The probe tools run here, on its host PID (attach puts the runtime
    // inside the container's file system for its dlopen).
    if (probing()) attach_probes(c, container_clone_.clone_pid, {});
}

// One checkpoint of production, restored once per clone.  Recorded, it is
// kept with the input that follows it; else it lives until the restores end.
void DebugSession::make_generation() {
    ++generation_;
    generation_start_s_ = now_s();
    if (!o_.container.empty()) return make_container_clone();
    std::string dir;
    if (ring_) {
        if (generation_ > 1) {  // the previous generation's input ends here
            recording_.complete = recording_on_;
            ring_->save(recording_);
        }
        recording_ = ring_->begin(o_.production, divergence_mode());
        dir = checkpoint_path(recording_);
    } else {
        dir = (fs::is_directory("/dev/shm") ? std::string("/dev/shm") : std::string("/run/iprobe")) +
              "/iprobe-checkpoint-" + name_;
        std::error_code ec;
        fs::remove_all(dir, ec);
    }
    struct RemoveUnlessRecorded {
        std::string dir;
        ~RemoveUnlessRecorded() {
            std::error_code ec;
            if (!dir.empty()) fs::remove_all(dir, ec);
        }
    } cleanup{ring_ ? std::string() : dir};
    CloneOptions co;
    co.pid = o_.pid;
    co.name = name_;
    co.progress = [this](const std::string& line) {
        if (!o_.json) std::fprintf(stderr, "iprobe debug: %s\n", line.c_str());
    };
    const Checkpoint cp = take_checkpoint(co, dir);
    // Connections the mirror opens from now on are the input that follows
    // this checkpoint (the first generation's mirror starts recording there).
    if (ring_ && mirror_ > 0) switch_recording(input_path(recording_));
    const auto shares = split_functions();
    for (Clone& c : clones_) {
        c.clone = restore_clone(cp, {c.name, co.progress, lifeline_read_.get()});
        c.alive = true;
        c.functions = shares[static_cast<std::size_t>(c.index)];
        const std::string clone_ip = subnet_addr(c.subnet, 2);
        c.debug_address = clone_ip + ":" + std::to_string(port_);
        connect_clone(c);
        event("clone",
              clone_label(c) + " running as PID " + std::to_string(c.clone.clone_pid) + " (PID " +
                  std::to_string(c.clone.clone_pid_in_ns) + " inside its namespace), reachable at " + c.debug_address,
              [&](JsonWriter& w) {
                  w.field("name", c.name)
                      .field("index", c.index)
                      .field("clone_pid", static_cast<std::int64_t>(c.clone.clone_pid))
                      .field("netns", c.clone.netns_path)
                      .field("debug_address", c.debug_address)
                      .field("freeze_us", static_cast<std::int64_t>(cp.freeze_ms * 1e3))
                      .field("total_us", static_cast<std::int64_t>(c.clone.total_ms * 1e3))
                      .field("generation", generation_);
              });
        if (probing())
            attach_probes(c, c.clone.clone_pid_in_ns,
                          {"nsenter", "--target", std::to_string(c.clone.keeper_pid), "--pid", "--mount", "--"});
    }
    if (ring_) {
        ring_->save(recording_);
        event("record",
              "generation " + std::to_string(recording_.generation) + " recorded in " + recording_.dir +
                  " (checkpoint, then the input of connections opened from now on)",
              [&](JsonWriter& w) {
                  w.field("generation", recording_.generation).field("dir", recording_.dir);
                  w.field("open_connections", recording_.open_at_start);
              });
    }
}

// The veth pair between here and the clone, and the NAT inside the clone
// that lets the mirror reach the service where it listens.
void DebugSession::connect_clone(Clone& c) {
    const std::string host_ip = subnet_addr(c.subnet, 1), clone_ip = subnet_addr(c.subnet, 2);
    create_veth(c.name, c.veth, host_ip + "/30", clone_ip + "/30");
    record_clone_veth(c.name, c.veth);
    const std::string ns = "--net=" + c.clone.netns_path;
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

void DebugSession::attach_probes(Clone& c, pid_t pid_in_clone, std::vector<std::string> in_clone) {
    const pid_t host_pid = o_.container.empty() ? c.clone.clone_pid : container_clone_.clone_pid;
    std::vector<std::string> sources = probe_sources_;
    if (sources.empty()) sources = split_list(o_.probes);
    c.probes = std::make_unique<CloneProbes>(hotpatch_tool_, std::move(in_clone), pid_in_clone, host_pid, sources);
    // Named one by one when the session turns them off and on or splits
    // them; else the user's globs as given.
    const bool by_name = !functions_.empty();
    if (by_name && c.functions.empty()) {
        event("attached", clone_label(c) + ": no functions to probe in this clone (fewer functions than clones)",
              [&](JsonWriter& w) { w.field("clone_pid", static_cast<std::int64_t>(host_pid)).field("clone", c.index).field("functions", 0); });
        return;
    }
    const hotpatch::AttachStats stats = c.probes->attach(by_name ? c.functions : split_list(o_.functions));
    for (const auto& f : c.functions) c.timeline.on(f, now_s());
    // The tool ran inside the clone's PID namespace: its PID there means nothing here.
    event("attached",
          "probes attached in " + clone_label(c) + " (PID " + std::to_string(host_pid) + "): " +
              hotpatch::attach_summary(stats) +
              (o_.clones > 1 ? "; its share: " + joined(c.functions, 8) : std::string()),
          [&](JsonWriter& w) {
              w.field("clone_pid", static_cast<std::int64_t>(host_pid)).field("clone", c.index);
              w.field("probes", static_cast<std::uint64_t>(stats.total_enabled));
              if (by_name) {
                  w.field("function_count", static_cast<std::uint64_t>(c.functions.size()));
                  // Named when few enough to read; `iprobe status` has the rest.
                  if (c.functions.size() <= 64) {
                      w.key("functions").begin_array();
                      for (const auto& f : c.functions) w.value(f);
                      w.end_array();
                  }
              }
          });
    if (o_.adapt)
        c.adapt = std::make_unique<AdaptController>(c.functions.size(), cost_.entry_ns, cost_.exit_ns);
    if (!o_.trace) return;
    // One clone's text trace goes straight to stdout; JSON, or several
    // clones, are relayed line by line (tagged with the clone).
    if (!o_.json && o_.clones == 1) {
        c.trace = c.probes->start_trace(false, 1, 2);
        return;
    }
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) < 0) throw_errno("pipe");
    UniqueFd rd(fds[0]), wr(fds[1]);
    c.trace = c.probes->start_trace(o_.json, wr.get(), 2);
    c.trace_out = std::move(rd);
    c.trace_partial.clear();
}

// Each line of a clone's trace becomes a "trace" event of ours (JSON), or a
// line tagged with the clone (text, several clones), so stdout stays one
// kind of line.
void DebugSession::relay_trace(Clone& c, bool drain) {
    if (!c.trace_out) return;
    char buf[65536];
    for (;;) {
        if (!drain) {
            pollfd p{c.trace_out.get(), POLLIN, 0};
            if (::poll(&p, 1, 0) <= 0) return;
        }
        const ssize_t n = ::read(c.trace_out.get(), buf, sizeof buf);
        if (n <= 0) {
            c.trace_out.reset();
            return;
        }
        c.trace_partial.append(buf, static_cast<size_t>(n));
        std::string out;
        std::size_t start = 0;
        const std::string tag = o_.clones > 1 ? "\"clone\":" + std::to_string(c.index) + "," : std::string();
        for (std::size_t nl; (nl = c.trace_partial.find('\n', start)) != std::string::npos; start = nl + 1) {
            const std::string_view line(c.trace_partial.data() + start, nl - start);
            if (!o_.json) {
                out += "[clone " + std::to_string(c.index + 1) + "] ";
                out += line;
                out += '\n';
                continue;
            }
            if (line.size() < 2 || line.front() != '{') continue;
            out += "{\"event\":\"trace\"," + tag;
            out += line.substr(1);
            out += '\n';
        }
        c.trace_partial.erase(0, start);
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

// The clones' aggregates, merged, and when each function was probed: the
// generation's record, before its clones go.
void DebugSession::report_generation() {
    std::vector<std::vector<hotpatch::FunctionStats>> per_clone;
    std::vector<const ProbeTimeline*> timelines;
    for (Clone& c : clones_) {
        std::vector<hotpatch::FunctionStats> rows;
        if (c.alive && c.probes) {
            try {
                rows = c.probes->functions();
            } catch (const Error&) {
                // never attached (no share), or the clone is gone: nothing counted
            }
        }
        // What each function cost, for the next generation's split.
        for (const auto& f : rows)
            measured_cost_[f.symbol] =
                (static_cast<double>(f.calls) * cost_.entry_ns + static_cast<double>(f.completed) * cost_.exit_ns) / 1e9;
        per_clone.push_back(std::move(rows));
        timelines.push_back(&c.timeline);
    }
    if (!probing()) return;
    const GenerationReport report = build_report(generation_, generation_start_s_, now_s(), per_clone, timelines);
    char heading[128];
    std::snprintf(heading, sizeof heading, "generation %d (%.1f-%.1f s), %zu function(s) called:\n", generation_,
                  report.start_s, report.end_s, report.rows.size());
    event("report", heading + report_table(report), [&](JsonWriter& w) { write_report(w, report); });
}

void DebugSession::drop_generation() {
    for (Clone& c : clones_) stop_child(c.trace, SIGINT, true);
    for (Clone& c : clones_) relay_trace(c, true);
    report_generation();
    remove_clones();
}

void DebugSession::remove_clones() {
    for (Clone& c : clones_) {
        c.adapt.reset();
        c.probes.reset();
        c.timeline = ProbeTimeline();
        if (!c.alive) continue;
        try {
            if (o_.container.empty()) destroy_clone(c.name);
            else destroy_container_clone(name_);
        } catch (const Error& e) {
            std::fprintf(stderr, "iprobe debug: removing clone %s: %s\n", c.name.c_str(), e.what());
        }
        c.alive = false;
    }
}

// The mirror's stdout (a pipe relayed to our stderr) tells people what it
// does; its readiness, and where its stats are, come on fd 3 as one JSON
// event; fd 4 is the socket we send it commands on (MirrorCommand).
void DebugSession::start_mirror() {
    int out[2], ready[2], control[2];
    if (::pipe2(out, O_CLOEXEC) < 0 || ::pipe2(ready, O_CLOEXEC) < 0 ||
        ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, control) < 0)
        throw_errno("pipe");
    UniqueFd out_rd(out[0]), out_wr(out[1]), ready_rd(ready[0]), ready_wr(ready[1]), control_ours(control[0]),
        control_theirs(control[1]);
    const std::string divergence = divergence_mode();
    std::vector<std::string> debug_addresses;
    for (const Clone& c : clones_) debug_addresses.push_back(c.debug_address);
    MirrorCommand command =
        mirror_command(o_, mirror_tool_, debug_addresses, port_, divergence, protocol_of_service(o_.pid));
    command.argv.insert(command.argv.end(), {"--control-fd", "4"});
    if (ring_) {
        command.argv.insert(command.argv.end(), {"--record", input_path(recording_)});
        recording_on_ = true;
    }
    mirror_ = spawn(command.argv, out_wr.get(), 2, false, {ready_wr.get(), control_theirs.get()});
    out_wr.reset();
    ready_wr.reset();
    control_theirs.reset();
    const auto event_line = read_line(ready_rd.get(), std::chrono::seconds(10), "iprobe mirror");
    if (!event_line) {
        int status = 0;
        ::waitpid(mirror_, &status, 0);
        mirror_ = -1;
        const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
        throw Error("iprobe mirror exited before it was ready (see its message above)",
                    code > 0 && code <= 7 ? static_cast<ExitCode>(code) : ExitCode::failure);
    }
    const proxy::MirrorReady ready_event = proxy::parse_ready_event(*event_line);
    if (!ready_event.stats) throw Error("iprobe mirror reported no stats endpoint");
    stats_at_ = *ready_event.stats;
    stats_port_ = stats_at_.port();
    mirror_out_ = std::move(out_rd);
    mirror_control_ = std::move(control_ours);
    const std::string stats = "127.0.0.1:" + std::to_string(stats_port_);
    event("mirror", mirror_summary(o_, command, divergence, "http://" + stats + "/"), [&](JsonWriter& w) {
        mirror_event_fields(w, o_, command);
        w.field("t_s", now_s()).field("stats_port", stats_port_).field("stats", "http://" + stats + "/");
        w.field("divergence", divergence);
    });
}

// Tells the mirror to record new connections into `path` ("" stops).
void DebugSession::switch_recording(const std::string& path) {
    const std::string line = proxy::to_json(proxy::MirrorCommand{proxy::MirrorCommand::Kind::record, path}) + "\n";
    if (::send(mirror_control_.get(), line.data(), line.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(line.size()))
        throw Error("the mirror's control socket is closed");
    const auto reply = read_line(mirror_control_.get(), std::chrono::seconds(5), "the mirror's recording command");
    if (!reply) throw Error("the mirror's control socket closed");
    const proxy::MirrorCommandReply r = proxy::parse_mirror_command_reply(*reply);
    if (!r.ok) throw Error("the mirror could not record into " + path + ": " + r.error);
    recording_on_ = !path.empty();
    recording_.open_at_start = r.open_connections;
}

// Keeps the record ring within --max-size.  A generation whose input alone
// passes it stops recording (what it has is whole connections up to then).
void DebugSession::trim_recording() {
    if (!ring_ || !recording_on_ || now_s() - last_trim_s_ < 1) return;
    last_trim_s_ = now_s();
    if (!ring_->trim(recording_)) return;
    switch_recording("");
    recording_.complete = false;
    ring_->save(recording_);
    event("record",
          "generation " + std::to_string(recording_.generation) + ": recording stopped, the ring reached --max-size",
          [&](JsonWriter& w) {
              w.field("generation", recording_.generation).field("stopped", "max-size");
          });
}

// One controller step per clone: the mirror's view of how far behind the
// clone is, the clone's exact per-function counts, its busiest thread.
void DebugSession::adapt_tick() {
    const auto stats = mirror_stats(stats_at_);
    if (!stats) return;
    const double t = now_s();
    for (Clone& c : clones_) {
        if (!c.adapt || !c.alive || static_cast<std::size_t>(c.index) >= stats->debug_targets.size()) continue;
        const auto& target = stats->debug_targets[static_cast<std::size_t>(c.index)];
        AdaptObservation o;
        o.t_s = t;
        o.fill = target.max_fill;
        o.lag_ms = std::max(target.max_pending_ms, target.max_reply_lag_ms);
        o.arrival_bytes = static_cast<double>(stats->bytes.client_to_production);
        o.fed_bytes = static_cast<double>(target.bytes);
        o.busy = c.cpu.sample(c.probes->host_pid(), t);
        try {
            for (const auto& e : c.probes->events(c.functions)) o.events.push_back({e.entries, e.exits});
        } catch (const Error& e) {
            // The clone is going (a re-clone, its end): nothing to decide for it.
            continue;
        }
        AdaptDecision d = c.adapt->observe(o);
        if (d.action == AdaptDecision::Action::none) continue;
        std::vector<std::string> names;
        for (std::size_t f : d.functions) names.push_back(c.functions[f]);
        const bool drop = d.action == AdaptDecision::Action::drop;
        try {
            if (drop) c.probes->detach(names);
            else c.probes->attach(names);
        } catch (const Error& e) {
            event("error", clone_label(c) + ": " + e.what(), [&](JsonWriter& w) { w.field("message", e.what()); });
            continue;
        }
        const double at = now_s();
        c.adapt->applied(d, at);
        for (const auto& n : names) drop ? c.timeline.off(n, at) : c.timeline.on(n, at);
        event("adapt",
              clone_label(c) + ": " + (drop ? "dropping " : "restoring ") + std::to_string(names.size()) +
                  " probed function(s) (" + joined(names, 6) + "; " + percent(d.cost) + " of a CPU" +
                  (drop ? "" : " predicted") + "): " + d.reason + "; " + std::to_string(c.adapt->on_count()) + " of " +
                  std::to_string(c.adapt->size()) + " functions probed",
              [&](JsonWriter& w) {
                  w.field("clone", c.index).field("t_s", at).field("action", drop ? "drop" : "restore");
                  w.key("functions").begin_array();
                  for (const auto& n : names) w.value(n);
                  w.end_array();
                  w.field("cost", d.cost).field("reason", d.reason).field("fill", o.fill).field("lag_ms", o.lag_ms);
                  w.field("busy", o.busy).field("probed", static_cast<std::uint64_t>(c.adapt->on_count()));
                  w.field("of", static_cast<std::uint64_t>(c.adapt->size()));
              });
    }
}

std::string DebugSession::divergence_mode() const {
    if (o_.divergence != "auto") return o_.divergence;
    if (std::string known = protocol_of_service(o_.pid); !known.empty()) return known;
    return o_.recloning == DebugOptions::Recloning::on_divergence ? "stream" : "off";
}

void DebugSession::teardown() {
    for (Clone& c : clones_) stop_child(c.trace, SIGINT, true);
    remove_clones();
    stop_child(mirror_, SIGTERM);
}

int DebugSession::run() {
    // Started in the background by a shell, SIGINT comes ignored; an
    // ignored signal never reaches the signalfd.
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGCHLD);
    sigprocmask(SIG_BLOCK, &mask, nullptr);
    UniqueFd sigfd(::signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK));

    prepare_probes();
    if (!o_.record_dir.empty()) ring_ = std::make_unique<RecordRing>(o_.record_dir, o_.record_max_bytes);
    // Clone first so the mirror's debug side exists when clients come.
    make_generation();
    start_mirror();
    double last_clone = now_ms();
    long long overflows_seen = 0, diverged_seen = 0;
    int exit_code = 0;
    const int tick_ms = o_.adapt ? 250 : 1000;
    double last_adapt = 0;
    for (;;) {
        std::vector<pollfd> p = {{sigfd.get(), POLLIN, 0}, {mirror_out_.get(), POLLIN, 0}};
        for (const Clone& c : clones_)
            if (c.trace_out) p.push_back({c.trace_out.get(), POLLIN, 0});
        ::poll(p.data(), p.size(), tick_ms);
        for (Clone& c : clones_) relay_trace(c, false);
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
        for (Clone& c : clones_)
            if (c.trace > 0 && ::waitpid(c.trace, &status, WNOHANG) == c.trace) c.trace = -1;
        if (stop) break;
        if (o_.adapt && now_ms() - last_adapt >= tick_ms) {
            last_adapt = now_ms();
            adapt_tick();
        }
        trim_recording();
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
            event("reclone", "re-cloning (" + why + ")",
                  [&](JsonWriter& w) { w.field("t_s", now_s()).field("reason", why).field("generation", generation_ + 1); });
            drop_generation();
            make_generation();
            last_clone = now_ms();
        }
    }
    // The traces end first, so "stopping" is the session's last line.
    for (Clone& c : clones_) stop_child(c.trace, SIGINT, true);
    for (Clone& c : clones_) relay_trace(c, true);
    report_generation();
    if (ring_ && recording_on_) {
        recording_.complete = true;
        ring_->save(recording_);
    }
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
    if (o.clones < 1) throw Error("--clones wants at least 1", ExitCode::usage);
    if (!o.container.empty()) {
        // Not yet: a mirror that follows a re-cloned container to its new address.
        if (o.recloning != DebugOptions::Recloning::off)
            throw Error("--recloning with --container is not supported yet", ExitCode::usage);
        if (o.clones > 1 || !o.record_dir.empty() || o.adapt)
            throw Error("--clones, --record and --adapt with --container are not supported yet", ExitCode::usage);
        o.pid = container_main_pid(o.container);
    }
    if (o.pid <= 0 || !fs::exists("/proc/" + std::to_string(o.pid)))
        throw Error("no process with PID " + std::to_string(o.pid), ExitCode::not_found);
    if (!o.record_dir.empty()) {
        // Every checkpoint copies the service's working directory.
        std::error_code ec;
        const fs::path cwd = fs::read_symlink("/proc/" + std::to_string(o.pid) + "/cwd", ec);
        const fs::path dir = fs::weakly_canonical(fs::absolute(o.record_dir), ec);
        const auto rel = dir.lexically_relative(cwd);
        if (!cwd.empty() && cwd != "/" && !rel.empty() && *rel.begin() != "..")
            throw Error("--record " + o.record_dir + " lies inside the service's working directory " + cwd.string() +
                            ", which each checkpoint copies; record somewhere else",
                        ExitCode::usage);
    }
    DebugSession session(o);
    return session.run();
}

}  // namespace iprobe::launcher
