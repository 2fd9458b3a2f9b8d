// `iprobe investigate` (retro.h): a recorded generation restored, probed
// and replayed; the ring itself is record_ring.cpp.
#include "iprobe/launcher/retro.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <poll.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "clone_probes.h"
#include "iprobe/hotpatch/attach_report.h"
#include "iprobe/launcher/clone.h"
#include "iprobe/proxy/replay.h"
#include "clone_patches.h"
#include "iprobe/support/error.h"
#include "iprobe/support/fd.h"
#include "iprobe/support/glob.h"
#include "iprobe/support/install_layout.h"
#include "iprobe/support/json.h"
#include "process.h"
#include "iprobe/launcher/session_events.h"
#include "session_report.h"

namespace fs = std::filesystem;

namespace iprobe::launcher {
namespace {

// Replays from inside the clone's network namespace, where the service
// listens on production's address; the thread joins it, the process does not.
proxy::ReplayResult replay_in(const std::string& netns_path, const proxy::ReplayOptions& options) {
    proxy::ReplayResult result;
    std::exception_ptr failure;
    std::thread worker([&] {
        try {
            UniqueFd ns(::open(netns_path.c_str(), O_RDONLY | O_CLOEXEC));
            if (!ns || ::setns(ns.get(), CLONE_NEWNET) != 0) throw_errno("joining the clone's network namespace");
            result = proxy::run_replay(options);
        } catch (...) {
            failure = std::current_exception();
        }
    });
    worker.join();
    if (failure) std::rethrow_exception(failure);
    return result;
}

}  // namespace

int run_investigate(const InvestigateOptions& o) {
    if (geteuid() != 0)
        throw Error("iprobe investigate needs root (CRIU, namespaces, ptrace); run it with sudo", ExitCode::permission);
    const auto generations = list_generations(o.dir);
    if (generations.empty()) throw Error(o.dir + " holds no recorded generation", ExitCode::not_found);
    auto chosen = generations.end() - 1;
    if (o.generation > 0) {
        chosen = std::find_if(generations.begin(), generations.end(), [&](const auto& g) { return g.generation == o.generation; });
        if (chosen == generations.end())
            throw Error("no generation " + std::to_string(o.generation) + " in " + o.dir + " (it has " +
                            std::to_string(generations.front().generation) + " to " +
                            std::to_string(generations.back().generation) + ")",
                        ExitCode::not_found);
    }
    const GenerationInfo& g = *chosen;
    const SessionEvents say(o.json, "iprobe investigate");
    const Checkpoint cp = load_checkpoint(checkpoint_path(g));
    if (!fs::exists(input_path(g))) throw Error(g.dir + " has no recorded input (input.rec)", ExitCode::not_found);
    const bool probing = !o.probes.empty() || !o.functions.empty();
    std::string hotpatch_tool;
    const std::vector<hotpatch::FunctionPatch> patches = patch_requests(o.patches);
    if (probing || !patches.empty()) {
        const auto tool = InstallLayout::current().helper("iprobe-hotpatch");
        if (!tool)
            throw Error("iprobe investigate needs iprobe-hotpatch in " + InstallLayout::current().libexec().string(),
                        ExitCode::unavailable);
        hotpatch_tool = tool->string();
    }
    proxy::ReplayOptions replay;
    replay.path = input_path(g);
    replay.to = proxy::parse_endpoint(g.service, "the recorded service address");
    replay.speed = o.speed;
    replay.compare = proxy::parse_protocol(o.compare == "auto" ? g.protocol : o.compare);
    replay.rules.every_difference = !patches.empty();
    if (!patches.empty() && replay.compare == proxy::Protocol::off)
        throw Error("--patch lists the replies the patch changed, so they must be compared: give --compare resp, http or "
                    "stream (this generation was recorded without a protocol)",
                    ExitCode::usage);

    // The clone ends with this process, whatever ends it.
    int lifeline[2];
    if (::pipe2(lifeline, O_CLOEXEC) < 0) throw_errno("pipe");
    UniqueFd lifeline_read(lifeline[0]), lifeline_write(lifeline[1]);
    const std::string name = o.name.empty() ? "iprobe-investigate-" + std::to_string(getpid()) : o.name;
    const CloneResult clone = restore_clone(cp, {name, [&](const std::string& line) {
                                                     if (!o.json) std::fprintf(stderr, "iprobe investigate: %s\n", line.c_str());
                                                 },
                                                 lifeline_read.get()});
    struct Destroy {
        std::string name;
        ~Destroy() {
            try {
                destroy_clone(name);
            } catch (const Error& e) {
                std::fprintf(stderr, "iprobe investigate: removing clone %s: %s\n", name.c_str(), e.what());
            }
        }
    } destroy{name};
    say("clone",
        "generation " + std::to_string(g.generation) + " restored as clone " + name + " (PID " +
            std::to_string(clone.clone_pid) + ") from the checkpoint of " + g.dir,
        [&](JsonWriter& w) {
            w.field("generation", g.generation).field("name", name).field("clone_pid", static_cast<std::int64_t>(clone.clone_pid));
            w.field("netns", clone.netns_path).field("open_at_start", g.open_at_start).field("complete", g.complete);
        });
    if (g.open_at_start)
        say("warning",
            std::to_string(g.open_at_start) + " connection(s) were open across the checkpoint: what they sent afterwards "
                                              "changed production but is not in this input",
            [&](JsonWriter& w) { w.field("open_at_start", g.open_at_start); });

    const std::vector<std::string> in_clone = {"nsenter", "--target", std::to_string(clone.keeper_pid), "--pid", "--mount", "--"};
    // Selected once, here, from the sources the agent loads: it is handed names.
    std::vector<std::string> sources = split_list(o.probes), functions;
    if (probing) {
        if (sources.empty()) sources = {fs::read_symlink("/proc/" + std::to_string(clone.clone_pid) + "/exe").string()};
        functions = selected_functions(sources, split_list(o.functions));
        if (functions.empty())
            throw Error("no probed function matches --functions " + o.functions + " in " + sources.front(), ExitCode::not_found);
    }
    // The clone's one agent, for its patches and its probes.
    std::optional<CloneProbes> probes;
    if (probing || !patches.empty()) probes.emplace(hotpatch_tool, in_clone, cp.pid, clone.clone_pid, sources,
                                       probes_recording(o.values, o.when, o.min_duration));
    if (!patches.empty()) patch_clone(say, *probes, "clone " + name, patches);
    if (probing) {
        const auto stats = probes->attach(functions);
        say("attached", "probes attached in the clone: " + hotpatch::attach_summary(stats),
            [&](JsonWriter& w) { w.field("probes", static_cast<std::uint64_t>(stats.total_enabled)); });
        if (o.trace) probes->start_trace();
    }
    // The trace is written as the agent sends it, while the replay runs.
    std::atomic<bool> replayed{false};
    std::thread relay_thread;
    if (probing && o.trace)
        relay_thread = std::thread([&] {
            for (bool more = true; more;) {
                more = !replayed;
                pollfd p{probes->fd(), POLLIN, 0};
                ::poll(&p, 1, 50);
                const bool alive = probes->pump();
                const std::string out = session_trace_lines(probes->take_trace(), o.json);
                std::fwrite(out.data(), 1, out.size(), stdout);
                std::fflush(stdout);
                if (!alive) break;
            }
        });

    const proxy::ReplayResult result = replay_in(clone.netns_path, replay);
    replayed = true;
    if (relay_thread.joinable()) relay_thread.join();
    if (probing && o.trace) {
        try {
            probes->stop_trace();
        } catch (const Error&) {
            // the agent is gone: what it sent was written
        }
        const std::string out = session_trace_lines(probes->take_trace(), o.json);
        std::fwrite(out.data(), 1, out.size(), stdout);
        std::fflush(stdout);
    }
    say("replay",
        "replayed " + std::to_string(result.connections) + " connection(s), " + std::to_string(result.bytes_sent) +
            " bytes, in " + std::to_string(result.elapsed_s) + " s (recorded over " + std::to_string(result.recorded_s) +
            " s)" + (replay.compare == proxy::Protocol::off ? std::string() : "; " + proxy::comparison_summary(result.comparison)),
        [&](JsonWriter& w) { w.key("result").raw(proxy::to_json(result)); });
    if (probing) {
        const GenerationReport report = build_report(g.generation, 0, result.elapsed_s, {probes->functions()}, {});
        // The result: on stdout for people too.
        if (o.json) say("report", {}, [&](JsonWriter& w) { write_report(w, report); });
        else std::printf("%s", report_table(report).c_str());
        std::fflush(stdout);
    }
    // The replay's summary above lists the changed replies for people.
    if (!patches.empty()) say_patch_effect(say, result.comparison);
    if (result.connect_failures || result.send_failures) return static_cast<int>(ExitCode::failure);
    // With --patch, replies that differ are the patch's effect, not a failure.
    return result.comparison.mismatches && patches.empty() ? static_cast<int>(ExitCode::failure) : 0;
}

}  // namespace iprobe::launcher
