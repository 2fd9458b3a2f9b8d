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
    if (!patch_args_.empty())
        patch_clone(events_, hotpatch_tool_, {}, container_clone_.clone_pid, container_clone_.clone_pid, "clone " + name_,
                    patch_args_);
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
        if (!patch_args_.empty())
            patch_clone(events_, hotpatch_tool_, in_clone, c.clone.clone_pid_in_ns, c.clone.clone_pid, clone_label(c),
                        patch_args_);
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

void DebugSession::attach_probes(Clone& c, pid_t pid_in_clone, std::vector<std::string> in_clone) {
    const pid_t host_pid = o_.container.empty() ? c.clone.clone_pid : container_clone_.clone_pid;
    std::vector<std::string> sources = probe_sources_;
    if (sources.empty()) sources = split_list(o_.probes);
    c.probes =
        std::make_unique<CloneProbes>(hotpatch_tool_, std::move(in_clone), pid_in_clone, host_pid, sources, o_.values);
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

}  // namespace iprobe::launcher::debug_session
