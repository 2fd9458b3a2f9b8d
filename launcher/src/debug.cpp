#include "iprobe/launcher/debug.h"

#include "debug_session.h"
#include "clone_patches.h"

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
namespace debug_session {

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

std::string joined(const std::vector<std::string>& items, std::size_t max) {
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

DebugSession::DebugSession(DebugOptions o) : o_(std::move(o)), events_(o_.json, "iprobe debug") {
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
    if (probing() || !o_.patches.empty()) hotpatch_tool_ = libexec_tool("iprobe-hotpatch");
    patches_ = patch_requests(o_.patches);
    if (!o_.patches.empty() && divergence_mode() == "off")
        throw Error("--patch shows the replies the patch changed, so the mirror must compare them: give --divergence "
                    "resp or http (or stream)",
                    ExitCode::usage);
    clones_.resize(static_cast<std::size_t>(o_.clones));
    const std::vector<int> subnets = o_.container.empty() ? pick_subnets(o_.clones) : std::vector<int>{0};
    for (int i = 0; i < o_.clones; ++i) {
        Clone& c = clones_[static_cast<std::size_t>(i)];
        c.index = i;
        c.subnet = subnets[static_cast<std::size_t>(i)];
        c.name = i == 0 ? name_ : name_ + "-" + std::to_string(i + 1);
        // Short and unique per session: interface names stop at 15 bytes.
        c.veth = "ipd" + std::to_string(getpid()) + (i == 0 ? "" : "c" + std::to_string(i));
        if (o_.container.empty()) c.debug_address = subnet_addr(c.subnet, 2) + ":" + std::to_string(port_);
    }
    if (o_.capture && o_.container.empty()) {
        fs::create_directories("/run/iprobe");
        hook_socket_ = "/run/iprobe/debug-hook-" + std::to_string(getpid()) + ".sock";
        hold_pending_ = true;
    }
    int lifeline[2];
    if (::pipe2(lifeline, O_CLOEXEC) < 0) throw_errno("pipe");
    lifeline_read_.reset(lifeline[0]);
    lifeline_write_.reset(lifeline[1]);
    started_ = std::chrono::steady_clock::now();
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
    MirrorCommand command = mirror_command(o_, mirror_tool_, debug_addresses, port_, divergence,
                                           protocol_of_service(o_.pid), hold_pending_ ? hook_socket_ : "");
    command.argv.insert(command.argv.end(), {"--control-fd", "4"});
    if (ring_ && !hold_pending_) {  // holding, the recording starts at the checkpoint
        command.argv.insert(command.argv.end(), {"--record", input_path(recording_)});
        recording_on_ = true;
    }
    // A group of its own: a terminal's Ctrl-C reaches the launcher only, which
    // then ends the session in order (the mirror's final stats first).
    mirror_ = spawn(command.argv, out_wr.get(), 2, true, {ready_wr.get(), control_theirs.get()});
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

// The first generation's clones are ready: the mirror feeds each connection
// held since before the checkpoint from the first request the checkpoint did
// not hold, and says what the clones miss.
void DebugSession::release_held_connections() {
    hold_pending_ = false;
    const std::string line =
        proxy::to_json(proxy::MirrorCommand{proxy::MirrorCommand::Kind::release, ""}) + "\n";
    if (::send(mirror_control_.get(), line.data(), line.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(line.size()))
        throw Error("the mirror's control socket is closed");
    const auto answer = read_line(mirror_control_.get(), std::chrono::seconds(5), "the mirror's release command");
    if (!answer) throw Error("the mirror's control socket closed");
    const proxy::MirrorCommandReply r = proxy::parse_mirror_command_reply(*answer);
    if (!r.ok) throw Error("the mirror could not feed the clone from the checkpoint: " + r.error);
    recording_.open_at_start = r.missed.size();
    std::string human = "the clone's start: capture began before the checkpoint; " + std::to_string(r.connections) +
                        " connection(s) open at the checkpoint, " + std::to_string(r.resumed) +
                        " fed to the clone from the first request the checkpoint did not hold (" +
                        std::to_string(r.skipped_requests) + " request(s) it held skipped)";
    if (r.missed.empty()) {
        human += "; the clone has every request production took";
    } else {
        human += "; the clone MISSES requests of " + std::to_string(r.missed.size()) +
                 " connection(s) and has diverged from its start:";
        for (const auto& m : r.missed)
            human += "\n  connection " + std::to_string(m.connection) + " (" + m.client + "): " +
                     (m.requests ? std::to_string(m.requests) + " request(s): " : std::string()) + m.reason;
    }
    event("capture-start", human, [&](JsonWriter& w) {
        w.field("t_s", now_s()).field("connections", r.connections).field("resumed", r.resumed);
        w.field("skipped_requests", r.skipped_requests).field("diverged", !r.missed.empty());
        w.key("missed").begin_array();
        for (const auto& m : r.missed) {
            w.begin_object().field("connection", m.connection).field("client", m.client);
            w.field("requests", m.requests).field("reason", m.reason).end_object();
        }
        w.end_array();
    });
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
        if (!c.adapt || !c.alive || c.process_gone_said || static_cast<std::size_t>(c.index) >= stats->debug_targets.size())
            continue;
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
    remove_clones();
    stop_child(mirror_, SIGTERM);
    if (!hook_socket_.empty()) ::unlink(hook_socket_.c_str());
}

int DebugSession::run() {
    // Started in the background by a shell, SIGINT comes ignored; an
    // ignored signal never reaches the signalfd.  Ctrl-C, SIGTERM and SIGHUP
    // (the terminal gone) all end the session the same way: reports, final
    // stats, everything removed, exit 0.  Every child leads a process group
    // of its own, so a signal to ours reaches none of them.
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    ::signal(SIGHUP, SIG_DFL);
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGHUP);
    sigaddset(&mask, SIGCHLD);
    sigprocmask(SIG_BLOCK, &mask, nullptr);
    UniqueFd sigfd(::signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK));

    prepare_probes();
    if (!o_.record_dir.empty()) ring_ = std::make_unique<RecordRing>(o_.record_dir, o_.record_max_bytes);
    // Clone first so the mirror's debug side exists when clients come; with
    // --capture the capture comes first and holds what the clone must get.
    if (hold_pending_) {
        start_mirror();
        // A request production has not read when it is frozen must have been
        // captured: let requests that arrived before the capture be read.
        std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
    make_generation();
    if (mirror_ < 0) start_mirror();
    double last_clone = now_ms();
    long long overflows_seen = 0, diverged_seen = 0;
    int exit_code = 0, stop_signal = 0;
    const int tick_ms = o_.adapt ? 250 : 1000;
    double last_adapt = 0;
    for (;;) {
        std::vector<pollfd> p = {{sigfd.get(), POLLIN, 0}, {mirror_out_.get(), POLLIN, 0}};
        for (const Clone& c : clones_)
            if (c.probes && c.probes->fd() >= 0) p.push_back({c.probes->fd(), POLLIN, 0});
        ::poll(p.data(), p.size(), tick_ms);
        std::string agent_gone;
        for (Clone& c : clones_) {
            if (relay_trace(c) || c.process_gone_said) continue;
            if (c.probes->target_exited()) {
                // The clone itself ended: said once; its aggregates stay
                // readable, and divergence (or the end) re-clones as before.
                c.process_gone_said = true;
                event("clone-exited", clone_label(c) + ": its process exited; its probe agent ended with it",
                      [&](JsonWriter& w) { w.field("clone", c.index).field("t_s", now_s()); });
            } else if (agent_gone.empty()) {
                agent_gone = "the probe agent of " + clone_label(c) + " ended (" + c.probes->why_gone() + ")";
            }
        }
        if (p[1].revents) {
            char buf[512];
            ssize_t n = ::read(mirror_out_.get(), buf, sizeof buf);
            if (n > 0 && !o_.json) (void)!::write(2, buf, static_cast<size_t>(n));
            if (n == 0) mirror_out_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
        }
        bool stop = false;
        signalfd_siginfo si;
        while (::read(sigfd.get(), &si, sizeof si) == sizeof si) {
            if (si.ssi_signo == SIGINT || si.ssi_signo == SIGTERM || si.ssi_signo == SIGHUP) {
                stop = true;
                stop_signal = static_cast<int>(si.ssi_signo);
            }
        }
        int status;
        if (!stop && mirror_ > 0 && ::waitpid(mirror_, &status, WNOHANG) == mirror_) {
            mirror_ = -1;
            const std::string how = WIFSIGNALED(status) ? std::string("was killed by signal ") + ::strsignal(WTERMSIG(status))
                                                        : "exited with " + std::to_string(WEXITSTATUS(status));
            event("error", "the mirror " + how + "; stopping", [&](JsonWriter& w) {
                w.field("message", "the mirror " + how + "; stopping").field("t_s", now_s());
            });
            exit_code = 1;
            stop = true;
        }
        if (!stop && !agent_gone.empty()) {
            // Its clone can no longer be probed: said, and the session ends
            // as it does when the mirror dies (the clones go with it).
            event("error", agent_gone + "; stopping",
                  [&](JsonWriter& w) { w.field("message", agent_gone + "; stopping").field("t_s", now_s()); });
            exit_code = 1;
            stop = true;
        }
        if (stop) break;
        if (o_.adapt && now_ms() - last_adapt >= tick_ms) {
            last_adapt = now_ms();
            adapt_tick();
        }
        trim_recording();
        if (!o_.patches.empty())
            if (const auto stats = mirror_stats(stats_at_))
                changes_said_ = say_changes(events_, stats->divergence, changes_said_, "patched clone");
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
    stop_traces();
    report_generation();
    if (ring_ && recording_on_) {
        recording_.complete = true;
        ring_->save(recording_);
    }
    // Relayed whole (with the open connections), as the mirror serves it.
    const auto final_stats = proxy::fetch_mirror_stats(stats_at_, std::chrono::seconds(2));
    if (!o_.patches.empty() && final_stats) {
        const proxy::MirrorStats parsed = proxy::parse_mirror_stats(*final_stats);
        changes_said_ = say_changes(events_, parsed.divergence, changes_said_, "patched clone");
        say_patch_effect(events_, parsed.divergence);
    }
    const std::string why = stop_signal ? std::string(" (") + sigabbrev_np(stop_signal) + ")" : std::string();
    std::string latency;
    if (pinger_) {
        const ClientPinger::Latency l = pinger_->latency();
        char line[160];
        std::snprintf(line, sizeof line, "; production answered a PING in %.2f ms (p50), %.2f ms (p99), %.1f ms (max)",
                      l.p50_us / 1e3, l.p99_us / 1e3, l.max_us / 1e3);
        latency = line;
    }
    event("stopping", "stopping" + why + ": removing the clone and the mirror; production keeps running" + latency,
          [&](JsonWriter& w) {
        if (!final_stats) w.key("stats").null();
        else w.key("stats").raw(*final_stats);
        if (stop_signal) w.field("signal", std::string("SIG") + sigabbrev_np(stop_signal));
        if (pinger_) {
            // Production's latency as a client saw it through the session.
            const ClientPinger::Latency l = pinger_->latency();
            w.key("production_latency").begin_object().field("samples", l.samples).field("p50_us", l.p50_us);
            w.field("p99_us", l.p99_us).field("max_us", l.max_us).field("by", "a PING every 10 ms on a connection of its own").end_object();
        }
    });
    teardown();
    return exit_code;
}

}  // namespace debug_session

using debug_session::DebugSession;

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
