// iprobe debug's session (debug_session.h): its life and signals, the
// checkpoints and re-cloning, the end; the mirror, the clones and the record
// ring are parts of their own.
#include "iprobe/launcher/debug.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <thread>

#include "clone_guardian.h"
#include "name_claim.h"
#include "clone_patches.h"
#include "clone_steps.h"
#include "debug_session.h"
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

}  // namespace

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
    const bool probing = !o_.probes.empty() || !o_.functions.empty();
    const std::string hotpatch_tool = probing || !o_.patches.empty() ? libexec_tool("iprobe-hotpatch") : "";
    std::vector<hotpatch::FunctionPatch> patches = patch_requests(o_.patches);
    if (!o_.patches.empty() && divergence_mode() == "off")
        throw Error("--patch shows the replies the patch changed, so the mirror must compare them: give --divergence "
                    "resp or http (or stream)",
                    ExitCode::usage);
    int lifeline[2];
    if (::pipe2(lifeline, O_CLOEXEC) < 0) throw_errno("pipe");
    lifeline_read_.reset(lifeline[0]);
    lifeline_write_.reset(lifeline[1]);
    started_ = std::chrono::steady_clock::now();
    clones_ = std::make_unique<CloneGeneration>(
        o_, CloneSetup{name_, service_ip_, port_, hotpatch_tool, std::move(patches), lifeline_read_.get(), started_}, events_);
    if (o_.capture && o_.container.empty()) {
        fs::create_directories("/run/iprobe");
        hook_socket_ = "/run/iprobe/debug-hook-" + std::to_string(getpid()) + ".sock";
        hold_pending_ = true;
    }
}

// The mirror (MirrorSupervisor): its stdout relayed to our stderr, its
// readiness and stats endpoint, its control socket.
void DebugSession::start_mirror() {
    const std::string divergence = divergence_mode();
    MirrorCommand command = mirror_command(o_, mirror_tool_, clones_->debug_addresses(), port_, divergence,
                                           protocol_of_service(o_.pid), hold_pending_ ? hook_socket_ : "");
    std::vector<std::string> argv = command.argv;
    const bool record_from_start = recording_ && !hold_pending_;  // holding, the recording starts at the checkpoint
    if (record_from_start) argv.insert(argv.end(), {"--record", recording_->input()});
    mirror_.start(argv);
    if (record_from_start) recording_->switched(true, recording_->current().open_at_start);
    const std::string stats = "127.0.0.1:" + std::to_string(mirror_.stats_endpoint().port());
    event("mirror", mirror_summary(o_, command, divergence, "http://" + stats + "/"), [&](JsonWriter& w) {
        mirror_event_fields(w, o_, command);
        w.field("t_s", now_s()).field("stats_port", mirror_.stats_endpoint().port()).field("stats", "http://" + stats + "/");
        w.field("divergence", divergence);
    });
}

// Tells the mirror to record new connections into `path` ("" stops).
void DebugSession::switch_recording(const std::string& path) {
    const std::uint64_t open = mirror_.record(path);
    recording_->switched(!path.empty(), open);
}

// The first generation's clones are ready: the mirror feeds each connection
// held since before the checkpoint from the first request the checkpoint did
// not hold, and says what the clones miss.
void DebugSession::release_held_connections() {
    hold_pending_ = false;
    const proxy::MirrorCommandReply r = mirror_.release();
    if (recording_) recording_->set_open_at_start(r.missed.size());
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
    if (!recording_ || !recording_->over_size(now_s())) return;
    switch_recording("");
    recording_->stopped();
    const int generation = recording_->current().generation;
    event("record", "generation " + std::to_string(generation) + ": recording stopped, the ring reached --max-size",
          [&](JsonWriter& w) { w.field("generation", generation).field("stopped", "max-size"); });
}


// A PING every millisecond on a connection of its own while production is
// checkpointed: the longest reply is the time production could not answer,
// as its clients felt it (CRIU's frozen_time leaves out the stopping phase,
// ~100 ms under podman).  A capturing mirror would take the connection for
// a client's, so with --capture it is only made before the mirror starts.
void DebugSession::start_client_view() {
    if (protocol_of_service(o_.pid) != "resp" || (o_.capture && mirror_.started())) {
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
    ContainerCloneOptions co{o_.container, name_, [this](const std::string& line) {
                                 if (!o_.json) std::fprintf(stderr, "iprobe debug: %s\n", line.c_str());
                             }};
    if (!container_guardian_) container_guardian_.emplace();  // clone_container tells it what it makes
    // The name is the session's from its first clone on: its guardian
    // removes clone containers by that name, whichever generation made them.
    if (!container_claim_) container_claim_.emplace(name_, "container", &*container_guardian_);
    start_client_view();
    const ContainerCloneResult clone = clone_container(co);
    clones_->adopt_container(clone, end_client_view());
}

// One checkpoint of production, restored once per clone.  Recorded, it is
// kept with the input that follows it; else it lives until the restores end.
void DebugSession::make_generation() {
    clones_->begin();
    if (!o_.container.empty()) return make_container_clone();
    // Forked before anything of the generation is made: killed outright
    // before every clone's keeper holds the lifeline, this launcher leaves
    // it the scratch checkpoint and the clones so far to remove.
    clone_steps::CloneGuardian guardian;
    // The scratch checkpoint below is by name: claimed first (restore_clone
    // claims each of the generation's other clones' names).
    const clone_steps::NameClaim claim(name_, "local", &guardian);
    std::string dir;
    if (recording_) {
        recording_->next_generation();
        dir = recording_->checkpoint();
    } else {
        dir = clone_steps::scratch_checkpoint_dir(name_);
        guardian.guard_scratch(dir);
        clone_steps::remove_tree(dir);
    }
    struct RemoveUnlessRecorded {
        std::string dir;
        ~RemoveUnlessRecorded() {
            std::error_code ec;
            if (!dir.empty()) fs::remove_all(dir, ec);
        }
    } cleanup{recording_ ? std::string() : dir};
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
    say_client_seen(o_.json, client_seen_us);
    // Connections the mirror opens from now on are the input that follows
    // this checkpoint (the first generation's mirror starts recording there).
    if (recording_ && mirror_.started()) switch_recording(recording_->input());
    clones_->restore(cp, !recording_, client_seen_us);
    // Each clone's keeper ends it with the session from now on.
    guardian.release();
    if (hold_pending_) release_held_connections();
    if (recording_) {
        recording_->save();
        const GenerationInfo& g = recording_->current();
        event("record",
              "generation " + std::to_string(g.generation) + " recorded in " + g.dir +
                  " (checkpoint, then the input of connections opened from now on)",
              [&](JsonWriter& w) {
                  w.field("generation", g.generation).field("dir", g.dir);
                  w.field("open_connections", g.open_at_start);
              });
    }
}

std::string DebugSession::divergence_mode() const {
    if (o_.divergence != "auto") return o_.divergence;
    if (std::string known = protocol_of_service(o_.pid); !known.empty()) return known;
    return o_.recloning == DebugOptions::Recloning::on_divergence ? "stream" : "off";
}

std::string DebugSession::reclone_reason(double last_clone_ms) {
    if (o_.recloning == DebugOptions::Recloning::periodic && now_ms() - last_clone_ms >= o_.period_s * 1000.0)
        return "periodic";
    if (o_.recloning == DebugOptions::Recloning::on_overflow) {
        // The clone missed requests: a copy's buffer overflowed, or the
        // capture lost a connection's bytes.
        const auto stats = mirror_.stats();
        const long long overflows =
            stats ? static_cast<long long>(stats->buffer.overflows + (stats->capture ? stats->capture->lost_connections : 0))
                  : -1;
        if (overflows > overflows_seen_) {
            overflows_seen_ = overflows;
            return "a connection's debug buffer overflowed";
        }
    } else if (o_.recloning == DebugOptions::Recloning::on_divergence) {
        const auto stats = mirror_.stats();
        const long long diverged = stats ? static_cast<long long>(stats->divergence.diverged_connections) : -1;
        if (diverged > diverged_seen_) {
            diverged_seen_ = diverged;
            return "the clone's replies diverged from production's";
        }
    }
    return "";
}

void DebugSession::teardown() {
    clones_->remove();
    container_guardian_.reset();  // released: the clone container is removed
    mirror_.stop();
    if (!hook_socket_.empty()) ::unlink(hook_socket_.c_str());
}

void DebugSession::say_stopping(int stop_signal, const std::optional<std::string>& final_stats) {
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

    clones_->select_probes();
    if (!o_.record_dir.empty())
        recording_ = std::make_unique<SessionRecording>(o_.record_dir, o_.record_max_bytes, o_.production, divergence_mode());
    // Clone first so the mirror's debug side exists when clients come; with
    // --capture the capture comes first and holds what the clone must get.
    if (hold_pending_) {
        start_mirror();
        // A request production has not read when it is frozen must have been
        // captured: let requests that arrived before the capture be read.
        std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
    make_generation();
    if (!mirror_.started()) start_mirror();
    double last_clone = now_ms();
    int exit_code = 0, stop_signal = 0;
    const int tick_ms = o_.adapt ? 250 : 1000;
    double last_adapt = 0;
    for (;;) {
        std::vector<pollfd> p = {{sigfd.get(), POLLIN, 0}, {mirror_.output_fd(), POLLIN, 0}};
        for (const int fd : clones_->agent_fds()) p.push_back({fd, POLLIN, 0});
        ::poll(p.data(), p.size(), tick_ms);
        const std::string agent_gone = clones_->pump();
        if (p[1].revents) mirror_.relay_output(o_.json ? -1 : 2);
        bool stop = false;
        signalfd_siginfo si;
        while (::read(sigfd.get(), &si, sizeof si) == sizeof si) {
            if (si.ssi_signo == SIGINT || si.ssi_signo == SIGTERM || si.ssi_signo == SIGHUP) {
                stop = true;
                stop_signal = static_cast<int>(si.ssi_signo);
            }
        }
        if (!stop)
            if (const auto how = mirror_.ended()) {
                event("error", "the mirror " + *how + "; stopping", [&](JsonWriter& w) {
                    w.field("message", "the mirror " + *how + "; stopping").field("t_s", now_s());
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
            if (const auto stats = mirror_.stats()) clones_->adapt(*stats);
        }
        trim_recording();
        if (!o_.patches.empty())
            if (const auto stats = mirror_.stats())
                changes_said_ = say_changes(events_, stats->divergence, changes_said_, "patched clone");
        if (const std::string why = reclone_reason(last_clone); !why.empty()) {
            event("reclone", "re-cloning (" + why + ")", [&](JsonWriter& w) {
                w.field("t_s", now_s()).field("reason", why).field("generation", clones_->number() + 1);
            });
            clones_->end();
            make_generation();
            last_clone = now_ms();
        }
    }
    // The traces end first, so "stopping" is the session's last line.
    clones_->stop_traces();
    clones_->report();
    if (recording_) recording_->finish();
    // Relayed whole (with the open connections), as the mirror serves it.
    const auto final_stats = mirror_.stats_document();
    if (!o_.patches.empty() && final_stats) {
        const proxy::MirrorStats parsed = proxy::parse_mirror_stats(*final_stats);
        changes_said_ = say_changes(events_, parsed.divergence, changes_said_, "patched clone");
        say_patch_effect(events_, parsed.divergence);
    }
    say_stopping(stop_signal, final_stats);
    teardown();
    return exit_code;
}

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
