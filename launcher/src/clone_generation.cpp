// iprobe debug's clones, generation after generation (clone_generation.h):
// their restores and connections, their probe agents, traces, --adapt steps
// and reports.
#include "iprobe/launcher/clone_generation.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <set>

#include "client_pinger.h"
#include "clone_patches.h"
#include "clone_probes.h"
#include "iprobe/hotpatch/attach_report.h"
#include "iprobe/launcher/adapt_controller.h"
#include "iprobe/support/error.h"
#include "iprobe/support/glob.h"
#include "iprobe/support/json.h"
#include "iprobe/support/proc.h"
#include "netns.h"
#include "probe_cost.h"
#include "process.h"
#include "session_report.h"

namespace fs = std::filesystem;

namespace iprobe::launcher {
namespace {

// /30s in 10.213.0.0/16 that no interface here uses: .1 host, .2 clone.
std::vector<int> pick_subnets(int count) {
    std::set<int> used;
    for (const InterfaceAddress& a : interface_addresses()) {
        in_addr ip{};
        if (a.family != "inet" || ::inet_pton(AF_INET, a.local.c_str(), &ip) != 1) continue;
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

// One clone of the current generation and what runs with it.
struct Clone {
    int index = 0;
    std::string name, veth, debug_address;
    int subnet = 0;
    bool alive = false;
    CloneResult clone;
    pid_t host_pid = -1;  // its root process, as this host sees it
    std::unique_ptr<CloneProbes> probes;
    std::vector<std::string> functions;  // symbols it probes (empty: the user's selector as given)
    std::unique_ptr<AdaptController> adapt;
    ProbeTimeline timeline;
    BusiestThread cpu;
    bool tracing = false;            // its agent streams the trace to us
    bool process_gone_said = false;  // its process exited, and the session said so
};

}  // namespace

std::vector<std::vector<std::string>> share_functions(const std::vector<std::string>& functions, std::size_t clones,
                                                      const std::map<std::string, double>& measured_cost) {
    std::vector<std::vector<std::string>> shares(clones);
    if (functions.empty() || clones == 0) return shares;
    if (clones == 1 || measured_cost.empty()) {
        for (std::size_t i = 0; i < functions.size(); ++i) shares[i % shares.size()].push_back(functions[i]);
        return shares;
    }
    std::vector<std::size_t> order(functions.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    auto cost_of = [&](std::size_t i) {
        auto it = measured_cost.find(functions[i]);
        return it == measured_cost.end() ? 0.0 : it->second;
    };
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return cost_of(a) > cost_of(b); });
    std::vector<double> load(shares.size(), 0);
    for (std::size_t i : order) {
        const auto least = static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
        shares[least].push_back(functions[i]);
        load[least] += cost_of(i);
    }
    return shares;
}

struct CloneGeneration::Impl {
    Impl(const DebugOptions& o, CloneSetup s, SessionEvents e) : o_(o), setup_(std::move(s)), events_(std::move(e)) {}

    bool probing() const { return !o_.probes.empty() || !o_.functions.empty(); }
    double now_s() const {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - setup_.started).count();
    }
    void event(const std::string& what, const std::string& human,
               const std::function<void(JsonWriter&)>& fields = {}) const {
        events_(what, human, fields);
    }
    std::string clone_label(const Clone& c) const {
        return o_.clones > 1 ? "clone " + std::to_string(c.index + 1) + " (" + c.name + ")" : "clone " + c.name;
    }
    void make_clones();
    void select_functions(std::vector<std::string> sources);
    void connect_clone(Clone& c);
    CloneProbes& agent_of(Clone& c, pid_t pid_in_clone, const std::vector<std::string>& in_clone);
    void attach_probes(Clone& c, pid_t pid_in_clone, const std::vector<std::string>& in_clone);
    bool relay_trace(Clone& c);

    DebugOptions o_;
    CloneSetup setup_;
    SessionEvents events_;
    std::vector<Clone> clones_;
    int generation_ = 0;
    double generation_start_s_ = 0;
    // The selected functions by symbol, the sources they were selected from,
    // what one of their events costs, and (after a generation) what each
    // cost then.
    std::vector<std::string> probe_sources_, functions_;
    ProbeCost cost_;
    std::map<std::string, double> measured_cost_;
};

void CloneGeneration::Impl::make_clones() {
    clones_.resize(static_cast<std::size_t>(o_.clones));
    const std::vector<int> subnets = o_.container.empty() ? pick_subnets(o_.clones) : std::vector<int>{0};
    for (int i = 0; i < o_.clones; ++i) {
        Clone& c = clones_[static_cast<std::size_t>(i)];
        c.index = i;
        c.subnet = subnets[static_cast<std::size_t>(i)];
        c.name = i == 0 ? setup_.name : setup_.name + "-" + std::to_string(i + 1);
        // Short and unique per session: interface names stop at 15 bytes.
        c.veth = "ipd" + std::to_string(getpid()) + (i == 0 ? "" : "c" + std::to_string(i));
        if (o_.container.empty()) c.debug_address = subnet_addr(c.subnet, 2) + ":" + std::to_string(setup_.port);
    }
}

CloneGeneration::CloneGeneration(const DebugOptions& options, CloneSetup setup, SessionEvents events)
    : impl_(std::make_unique<Impl>(options, std::move(setup), std::move(events))) {
    impl_->make_clones();
}

CloneGeneration::~CloneGeneration() { remove(); }

std::vector<std::string> CloneGeneration::debug_addresses() const {
    std::vector<std::string> out;
    for (const Clone& c : impl_->clones_) out.push_back(c.debug_address);
    return out;
}

// The selection is made here once, from the sources attach would read:
// the clones' agents are handed functions by name (to split them, to turn
// them off and on), never the user's globs.
void CloneGeneration::select_probes() {
    Impl& s = *impl_;
    if (!s.probing()) return;
    std::vector<std::string> sources = split_list(s.o_.probes);
    // A container's program is known once its clone runs (adopt_container).
    if (sources.empty() && s.o_.container.empty())
        sources = {fs::read_symlink("/proc/" + std::to_string(s.o_.pid) + "/exe").string()};
    if (!sources.empty()) s.select_functions(std::move(sources));
    if (!s.o_.adapt && s.o_.clones == 1) return;
    s.cost_ = measure_probe_cost();
    s.event("probe-cost",
            "a probed call costs " + std::to_string(static_cast<int>(std::lround(s.cost_.entry_ns + s.cost_.exit_ns))) +
                " ns here (entry " + std::to_string(s.cost_.entry_ns) + " ns, exit " + std::to_string(s.cost_.exit_ns) +
                " ns, measured on iprobe-probe-cost); " + std::to_string(s.functions_.size()) + " functions selected",
            [&](JsonWriter& w) {
                w.field("entry_ns", s.cost_.entry_ns).field("exit_ns", s.cost_.exit_ns).field("unprobed_ns", s.cost_.unprobed_ns);
                w.field("functions", static_cast<std::uint64_t>(s.functions_.size()));
            });
}

void CloneGeneration::Impl::select_functions(std::vector<std::string> sources) {
    probe_sources_ = std::move(sources);
    functions_ = selected_functions(probe_sources_, split_list(o_.functions));
    if (functions_.empty())
        throw Error("no probed function matches --functions " + o_.functions + " in " + joined(probe_sources_),
                    ExitCode::not_found);
}

void CloneGeneration::begin() {
    ++impl_->generation_;
    impl_->generation_start_s_ = impl_->now_s();
}

int CloneGeneration::number() const { return impl_->generation_; }

void CloneGeneration::adopt_container(const ContainerCloneResult& clone, double client_seen_us) {
    Impl& s = *impl_;
    Clone& c = s.clones_.front();
    c.alive = true;
    c.host_pid = clone.clone_pid;
    c.debug_address = clone.address + ":" + std::to_string(s.setup_.port);
    s.event("clone",
            "clone " + s.setup_.name + " running: container " + clone.id.substr(0, 12) + ", PID " +
                std::to_string(clone.clone_pid) + ", reachable at " + c.debug_address,
            [&](JsonWriter& w) {
                w.field("name", s.setup_.name)
                    .field("container_id", clone.id)
                    .field("clone_pid", static_cast<std::int64_t>(clone.clone_pid))
                    .field("debug_address", c.debug_address)
                    .field("freeze_us", static_cast<std::int64_t>(clone.freeze_ms * 1e3))
                    .field("unavailable_us", static_cast<std::int64_t>((clone.freezing_ms + clone.freeze_ms) * 1e3))
                    .field("total_us", static_cast<std::int64_t>(clone.total_ms * 1e3))
                    .field("generation", s.generation_);
                if (client_seen_us >= 0) w.field("client_seen_us", static_cast<std::int64_t>(client_seen_us));
            });
    say_client_seen(s.o_.json, client_seen_us);
    // The probe tools run here, on its host PID (attach puts the runtime
    // inside the container's file system for its dlopen).
    if (!s.setup_.patches.empty())
        patch_clone(s.events_, s.agent_of(c, clone.clone_pid, {}), "clone " + s.setup_.name, s.setup_.patches);
    if (s.probing()) {
        if (s.functions_.empty()) {  // no --probes: the container's program, as this host sees it
            const std::string proc = "/proc/" + std::to_string(clone.clone_pid);
            s.select_functions({proc + "/root" + fs::read_symlink(proc + "/exe").string()});
        }
        c.functions = s.functions_;
        s.attach_probes(c, clone.clone_pid, {});
    }
}

void CloneGeneration::restore(const Checkpoint& cp, bool scratch_checkpoint, double client_seen_us) {
    Impl& s = *impl_;
    const auto shares = share_functions(s.functions_, s.clones_.size(), s.measured_cost_);
    const auto progress = [json = s.o_.json](const std::string& line) {
        if (!json) std::fprintf(stderr, "iprobe debug: %s\n", line.c_str());
    };
    for (Clone& c : s.clones_) {
        c.clone = restore_clone(cp, {c.name, progress, s.setup_.lifeline_fd, scratch_checkpoint});
        c.alive = true;
        c.host_pid = c.clone.clone_pid;
        c.functions = shares[static_cast<std::size_t>(c.index)];
        c.debug_address = subnet_addr(c.subnet, 2) + ":" + std::to_string(s.setup_.port);
        s.connect_clone(c);
        s.event("clone",
                s.clone_label(c) + " running as PID " + std::to_string(c.clone.clone_pid) + " (PID " +
                    std::to_string(c.clone.clone_pid_in_ns) + " inside its namespace), reachable at " + c.debug_address,
                [&](JsonWriter& w) {
                    w.field("name", c.name)
                        .field("index", c.index)
                        .field("clone_pid", static_cast<std::int64_t>(c.clone.clone_pid))
                        .field("netns", c.clone.netns_path)
                        .field("debug_address", c.debug_address)
                        .field("freeze_us", static_cast<std::int64_t>(cp.freeze_ms * 1e3))
                        .field("unavailable_us", static_cast<std::int64_t>((cp.freezing_ms + cp.freeze_ms) * 1e3))
                        .field("total_us", static_cast<std::int64_t>(c.clone.total_ms * 1e3))
                        .field("generation", s.generation_);
                    if (client_seen_us >= 0) w.field("client_seen_us", static_cast<std::int64_t>(client_seen_us));
                });
        const std::vector<std::string> in_clone = {"nsenter", "--target", std::to_string(c.clone.keeper_pid), "--pid",
                                                   "--mount", "--"};
        if (!s.setup_.patches.empty())
            patch_clone(s.events_, s.agent_of(c, c.clone.clone_pid_in_ns, in_clone), s.clone_label(c), s.setup_.patches);
        if (s.probing()) s.attach_probes(c, c.clone.clone_pid_in_ns, in_clone);
    }
}

// The veth pair between here and the clone, and the NAT inside the clone
// that lets the mirror reach the service where it listens.
void CloneGeneration::Impl::connect_clone(Clone& c) {
    const std::string host_ip = subnet_addr(c.subnet, 1), clone_ip = subnet_addr(c.subnet, 2);
    const std::string port = std::to_string(setup_.port);
    // Recorded first: a launcher killed while the pair is made leaves
    // --destroy its name.
    record_clone_veth(c.name, c.veth);
    create_veth(c.name, c.veth, host_ip + "/30", clone_ip + "/30");
    const std::string ns = "--net=" + c.clone.netns_path;
    const std::string& target = setup_.service_ip;
    const bool loopback = target.rfind("127.", 0) == 0;
    if (loopback)
        run_checked({"nsenter", ns, "sysctl", "-q", "-w", "net.ipv4.conf.eth0.route_localnet=1"},
                    "allowing loopback forwarding in the clone");
    // Forward what arrives on the veth to the address the service listens
    // on inside the clone (production's own, see clone_process) ...
    run_checked({"nsenter", ns, "iptables", "-t", "nat", "-A", "PREROUTING", "-i", "eth0", "-p", "tcp", "--dport",
                 port, "-j", "DNAT", "--to-destination", target + ":" + port},
                "forwarding the clone's port to the service address");
    // ... and make the mirror's connections look local there too, or a
    // service that trusts only loopback (redis' protected mode) refuses them.
    if (loopback)
        run_checked({"nsenter", ns, "iptables", "-t", "nat", "-A", "INPUT", "-p", "tcp", "-s", host_ip, "-d", target,
                     "--dport", port, "-j", "SNAT", "--to-source", "127.0.0.1"},
                    "making the mirror's connections local in the clone");
}

// The clone's one probe agent, started at the first need (probes, patches).
CloneProbes& CloneGeneration::Impl::agent_of(Clone& c, pid_t pid_in_clone, const std::vector<std::string>& in_clone) {
    if (!c.probes)
        c.probes = std::make_unique<CloneProbes>(setup_.hotpatch_tool, in_clone, pid_in_clone, c.host_pid, probe_sources_,
                                                 probes_recording(o_.values, o_.when, o_.min_duration));
    return *c.probes;
}

void CloneGeneration::Impl::attach_probes(Clone& c, pid_t pid_in_clone, const std::vector<std::string>& in_clone) {
    const pid_t host_pid = c.host_pid;
    if (c.functions.empty()) {
        event("attached", clone_label(c) + ": no functions to probe in this clone (fewer functions than clones)",
              [&](JsonWriter& w) { w.field("clone_pid", static_cast<std::int64_t>(host_pid)).field("clone", c.index).field("functions", 0); });
        return;
    }
    // The clone's one probe agent: every change from now on is a message.
    const hotpatch::AttachStats stats = agent_of(c, pid_in_clone, in_clone).attach(c.functions);
    for (const auto& f : c.functions) c.timeline.on(f, now_s());
    // The agent runs inside the clone's PID namespace: its PID there means nothing here.
    event("attached",
          "probes attached in " + clone_label(c) + " (PID " + std::to_string(host_pid) + "): " +
              hotpatch::attach_summary(stats) +
              (o_.clones > 1 ? "; its share: " + joined(c.functions, 8) : std::string()),
          [&](JsonWriter& w) {
              w.field("clone_pid", static_cast<std::int64_t>(host_pid)).field("clone", c.index);
              w.field("probes", static_cast<std::uint64_t>(stats.total_enabled));
              w.field("function_count", static_cast<std::uint64_t>(c.functions.size()));
              // Named when few enough to read; `iprobe status` has the rest.
              if (c.functions.size() <= 64) {
                  w.key("functions").begin_array();
                  for (const auto& f : c.functions) w.value(f);
                  w.end_array();
              }
          });
    if (o_.adapt) c.adapt = std::make_unique<AdaptController>(c.functions.size(), cost_.entry_ns, cost_.exit_ns);
    if (!o_.trace) return;
    c.probes->start_trace(o_.lossless);
    c.tracing = true;
}

// The records the clone's agent sent: "trace" events of ours (JSON, tagged
// with the clone when there are several), or lines for people on stdout
// (tagged likewise).  False once the agent is gone.
bool CloneGeneration::Impl::relay_trace(Clone& c) {
    if (!c.probes) return true;
    const bool alive = c.probes->pump();
    const auto records = c.probes->take_trace();
    if (records.empty()) return alive;
    const std::string out =
        session_trace_lines(records, o_.json, o_.clones > 1 ? std::optional<int>(c.index) : std::nullopt);
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fflush(stdout);
    return alive;
}

std::vector<int> CloneGeneration::agent_fds() const {
    std::vector<int> fds;
    for (const Clone& c : impl_->clones_)
        if (c.probes && c.probes->fd() >= 0) fds.push_back(c.probes->fd());
    return fds;
}

std::string CloneGeneration::pump() {
    Impl& s = *impl_;
    std::string agent_gone;
    for (Clone& c : s.clones_) {
        if (s.relay_trace(c) || c.process_gone_said) continue;
        if (c.probes->target_exited()) {
            // The clone itself ended: said once; its aggregates stay
            // readable, and divergence (or the end) re-clones as before.
            c.process_gone_said = true;
            s.event("clone-exited", s.clone_label(c) + ": its process exited; its probe agent ended with it",
                    [&](JsonWriter& w) { w.field("clone", c.index).field("t_s", s.now_s()); });
        } else if (agent_gone.empty()) {
            agent_gone = "the probe agent of " + s.clone_label(c) + " ended (" + c.probes->why_gone() + ")";
        }
    }
    return agent_gone;
}

// One controller step per clone: the mirror's view of how far behind the
// clone is, the clone's exact per-function counts, its busiest thread.
void CloneGeneration::adapt(const proxy::MirrorStats& stats) {
    Impl& s = *impl_;
    const double t = s.now_s();
    for (Clone& c : s.clones_) {
        if (!c.adapt || !c.alive || c.process_gone_said || static_cast<std::size_t>(c.index) >= stats.debug_targets.size())
            continue;
        const auto& target = stats.debug_targets[static_cast<std::size_t>(c.index)];
        AdaptObservation o;
        o.t_s = t;
        o.fill = target.max_fill;
        o.lag_ms = std::max(target.max_pending_ms, target.max_reply_lag_ms);
        o.arrival_bytes = static_cast<double>(stats.bytes.client_to_production);
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
            s.event("error", s.clone_label(c) + ": " + e.what(), [&](JsonWriter& w) { w.field("message", e.what()); });
            continue;
        }
        const double at = s.now_s();
        c.adapt->applied(d, at);
        for (const auto& n : names) drop ? c.timeline.off(n, at) : c.timeline.on(n, at);
        s.event("adapt",
                s.clone_label(c) + ": " + (drop ? "dropping " : "restoring ") + std::to_string(names.size()) +
                    " probed function(s) (" + joined(names, 6) + "; " + percent(d.cost) + " of a CPU" +
                    (drop ? "" : " predicted") + "): " + d.reason + "; " + std::to_string(c.adapt->on_count()) +
                    " of " + std::to_string(c.adapt->size()) + " functions probed",
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

// Ends every clone's trace stream, writing what it still held.
void CloneGeneration::stop_traces() {
    Impl& s = *impl_;
    for (Clone& c : s.clones_) {
        if (!c.tracing || !c.probes) continue;
        try {
            c.probes->stop_trace();
        } catch (const Error&) {
            // the agent is gone: what it sent is relayed below
        }
        s.relay_trace(c);
        if (const std::uint64_t dropped = c.probes->trace_dropped())
            s.event("trace-dropped",
                    s.clone_label(c) + ": " + std::to_string(dropped) +
                        " trace events dropped (a ring was full; the report's sums are unaffected)",
                    [&](JsonWriter& w) { w.field("clone", c.index).field("dropped", dropped); });
        c.tracing = false;
    }
}

// The clones' aggregates, merged, and when each function was probed: the
// generation's record, before its clones go.
void CloneGeneration::report() {
    Impl& s = *impl_;
    std::vector<std::vector<hotpatch::FunctionStats>> per_clone;
    std::vector<const ProbeTimeline*> timelines;
    for (Clone& c : s.clones_) {
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
            s.measured_cost_[f.symbol] =
                (static_cast<double>(f.calls) * s.cost_.entry_ns + static_cast<double>(f.completed) * s.cost_.exit_ns) / 1e9;
        per_clone.push_back(std::move(rows));
        timelines.push_back(&c.timeline);
    }
    if (!s.probing()) return;
    const GenerationReport report =
        build_report(s.generation_, s.generation_start_s_, s.now_s(), per_clone, timelines);
    char heading[128];
    std::snprintf(heading, sizeof heading, "generation %d (%.1f-%.1f s), %zu function(s) called:\n", s.generation_,
                  report.start_s, report.end_s, report.rows.size());
    s.event("report", heading + report_table(report), [&](JsonWriter& w) { write_report(w, report); });
}

void CloneGeneration::end() {
    stop_traces();
    report();
    remove();
}

void CloneGeneration::remove() {
    Impl& s = *impl_;
    for (Clone& c : s.clones_) {
        c.adapt.reset();
        c.probes.reset();
        c.process_gone_said = false;
        c.timeline = ProbeTimeline();
        if (!c.alive) continue;
        try {
            if (s.o_.container.empty()) destroy_clone(c.name);
            else destroy_container_clone(s.setup_.name);
        } catch (const Error& e) {
            std::fprintf(stderr, "iprobe debug: removing clone %s: %s\n", c.name.c_str(), e.what());
        }
        c.alive = false;
    }
}

}  // namespace iprobe::launcher
