// iprobe debug: each generation of clones, the probes in them, their traces
// and what each generation measured.
#include "debug_session.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include <nlohmann/json.hpp>

#include "iprobe/launcher/adapt_controller.h"
#include "clone_patches.h"
#include "clone_probes.h"
#include "iprobe/hotpatch/attach_report.h"
#include "iprobe/launcher/clone.h"
#include "iprobe/launcher/container.h"
#include "iprobe/launcher/retro.h"
#include "iprobe/proxy/stats.h"
#include "iprobe/support/error.h"
#include "iprobe/support/fd.h"
#include "iprobe/support/glob.h"
#include "iprobe/support/json.h"
#include "iprobe/support/proc.h"
#include "netns.h"
#include "probe_cost.h"
#include "process.h"
#include "session_events.h"
#include "session_report.h"

namespace fs = std::filesystem;

namespace iprobe::launcher::debug_session {

// With --adapt or --clones the functions are named one by one (to turn off
// and on, to split), so the selection is resolved here, from the same
// sources attach reads.
// The selection is made here once, from the sources attach would read:
// the clones' agents are handed functions by name (to split them, to turn
// them off and on), never the user's globs.
void DebugSession::prepare_probes() {
    if (!probing()) return;
    std::vector<std::string> sources = split_list(o_.probes);
    // A container's program is known once its clone runs (make_container_clone).
    if (sources.empty() && o_.container.empty())
        sources = {fs::read_symlink("/proc/" + std::to_string(o_.pid) + "/exe").string()};
    if (!sources.empty()) select_functions(std::move(sources));
    if (!o_.adapt && o_.clones == 1) return;
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

void DebugSession::select_functions(std::vector<std::string> sources) {
    probe_sources_ = std::move(sources);
    functions_ = selected_functions(probe_sources_, split_list(o_.functions));
    if (functions_.empty())
        throw Error("no probed function matches --functions " + o_.functions + " in " + joined(probe_sources_),
                    ExitCode::not_found);
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

// A PING every millisecond on a connection of its own while production is
// checkpointed: the longest reply is the time production could not answer,
// as its clients felt it (CRIU's frozen_time leaves out the stopping phase,
// ~100 ms under podman).  A capturing mirror would take the connection for
// a client's, so with --capture it is only made before the mirror starts.
void DebugSession::start_client_view() {
    if (protocol_of_service(o_.pid) != "resp" || (o_.capture && mirror_ > 0)) {
        pinger_.reset();
        return;
    }
    if (!pinger_) pinger_ = ClientPinger::start(service_ip_ + ":" + std::to_string(port_), std::chrono::milliseconds(1));
    if (!pinger_) return;
    pinger_->set_interval(std::chrono::milliseconds(1));
    pinger_->begin_window();
}

double DebugSession::end_client_view() {
    if (!pinger_) return -1;
    const double seen_us = pinger_->window_max_us();
    // Through the session: a sample of production's latency every 10 ms
    // (not with --capture, see above).
    if (o_.capture) pinger_.reset();
    else pinger_->set_interval(std::chrono::milliseconds(10));
    return seen_us;
}

void DebugSession::make_container_clone() {
    Clone& c = clones_.front();
    ContainerCloneOptions co{o_.container, name_, [this](const std::string& line) {
                                 if (!o_.json) std::fprintf(stderr, "iprobe debug: %s\n", line.c_str());
                             }};
    start_client_view();
    container_clone_ = clone_container(co);
    const double client_seen_us = end_client_view();
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
                  .field("unavailable_us",
                         static_cast<std::int64_t>((container_clone_.freezing_ms + container_clone_.freeze_ms) * 1e3))
                  .field("total_us", static_cast<std::int64_t>(container_clone_.total_ms * 1e3))
                  .field("generation", generation_);
              if (client_seen_us >= 0) w.field("client_seen_us", static_cast<std::int64_t>(client_seen_us));
          });
    say_client_seen(client_seen_us);
    // The probe tools run here, on its host PID (attach puts the runtime
    // inside the container's file system for its dlopen).
    if (!patches_.empty()) patch_clone(events_, agent_of(c, container_clone_.clone_pid, {}), "clone " + name_, patches_);
    if (probing()) {
        if (functions_.empty()) {  // no --probes: the container's program, as this host sees it
            const std::string proc = "/proc/" + std::to_string(container_clone_.clone_pid);
            select_functions({proc + "/root" + fs::read_symlink(proc + "/exe").string()});
        }
        c.functions = functions_;
        attach_probes(c, container_clone_.clone_pid, {});
    }
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
    if (hold_pending_) co.frozen_hook_socket = hook_socket_;
    start_client_view();
    const Checkpoint cp = take_checkpoint(co, dir);
    const double client_seen_us = end_client_view();
    say_client_seen(client_seen_us);
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
                      .field("unavailable_us", static_cast<std::int64_t>((cp.freezing_ms + cp.freeze_ms) * 1e3))
                      .field("total_us", static_cast<std::int64_t>(c.clone.total_ms * 1e3))
                      .field("generation", generation_);
                  if (client_seen_us >= 0) w.field("client_seen_us", static_cast<std::int64_t>(client_seen_us));
              });
        const std::vector<std::string> in_clone = {"nsenter", "--target", std::to_string(c.clone.keeper_pid), "--pid",
                                                   "--mount", "--"};
        if (!patches_.empty())
            patch_clone(events_, agent_of(c, c.clone.clone_pid_in_ns, in_clone), clone_label(c), patches_);
        if (probing()) attach_probes(c, c.clone.clone_pid_in_ns, in_clone);
    }
    if (hold_pending_) release_held_connections();
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
    // Recorded first: a launcher killed while the pair is made leaves
    // --destroy its name.
    record_clone_veth(c.name, c.veth);
    create_veth(c.name, c.veth, host_ip + "/30", clone_ip + "/30");
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

CloneProbes& DebugSession::agent_of(Clone& c, pid_t pid_in_clone, const std::vector<std::string>& in_clone) {
    const pid_t host_pid = o_.container.empty() ? c.clone.clone_pid : container_clone_.clone_pid;
    if (!c.probes) c.probes = std::make_unique<CloneProbes>(hotpatch_tool_, in_clone, pid_in_clone, host_pid, probe_sources_,
                                                         probes_recording(o_.values, o_.when, o_.min_duration));
    return *c.probes;
}

void DebugSession::attach_probes(Clone& c, pid_t pid_in_clone, const std::vector<std::string>& in_clone) {
    const pid_t host_pid = o_.container.empty() ? c.clone.clone_pid : container_clone_.clone_pid;
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
    if (o_.adapt)
        c.adapt = std::make_unique<AdaptController>(c.functions.size(), cost_.entry_ns, cost_.exit_ns);
    if (!o_.trace) return;
    c.probes->start_trace(o_.lossless);
    c.tracing = true;
}

// The records the clone's agent sent: "trace" events of ours (JSON, tagged
// with the clone when there are several), or lines for people on stdout
// (tagged likewise).
bool DebugSession::relay_trace(Clone& c) {
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

// Ends every clone's trace stream, writing what it still held.
void DebugSession::stop_traces() {
    for (Clone& c : clones_) {
        if (!c.tracing || !c.probes) continue;
        try {
            c.probes->stop_trace();
        } catch (const Error&) {
            // the agent is gone: what it sent is relayed below
        }
        relay_trace(c);
        if (const std::uint64_t dropped = c.probes->trace_dropped())
            event("trace-dropped",
                  clone_label(c) + ": " + std::to_string(dropped) +
                      " trace events dropped (a ring was full; the report's sums are unaffected)",
                  [&](JsonWriter& w) { w.field("clone", c.index).field("dropped", dropped); });
        c.tracing = false;
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
    stop_traces();
    report_generation();
    remove_clones();
}

void DebugSession::remove_clones() {
    for (Clone& c : clones_) {
        c.adapt.reset();
        c.probes.reset();
        c.process_gone_said = false;
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

}  // namespace iprobe::launcher::debug_session
