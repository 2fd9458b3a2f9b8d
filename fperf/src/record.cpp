#include "iprobe/fperf/record.h"

#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "iprobe/fperf/attach.h"
#include "iprobe/fperf/events.h"
#include "iprobe/fperf/profile.h"
#include "iprobe/fperf/session.h"
#include "iprobe/fperf/symbols.h"
#include "iprobe/probelist/probe_list.h"
#include "iprobe/probelist/probe_source.h"
#include "iprobe/support/error.h"
#include "iprobe/support/fd.h"
#include "iprobe/support/glob.h"
#include "iprobe/support/install_layout.h"
#include "budget_daemon.h"
#include "record_target.h"
#include "symbolizer.h"


namespace iprobe::fperf {

using iprobe::Error;
using iprobe::ExitCode;

namespace {

volatile sig_atomic_t g_stop_signal = 0;
void on_stop_signal(int sig) { g_stop_signal = sig; }

class Log {
public:
    explicit Log(bool quiet) : quiet_(quiet) {}
    void operator()(const char* format, ...) const __attribute__((format(printf, 2, 3))) {
        if (quiet_) return;
        std::va_list args;
        va_start(args, format);
        std::fputs("fperf: ", stderr);
        std::vfprintf(stderr, format, args);
        std::fputc('\n', stderr);
        va_end(args);
    }

private:
    bool quiet_;
};

// ---- which functions, and their names ----

// ---- costs ----

// ---- start mode ----

// ---- the daemon ----

std::string format_budget(const RecordOptions& o) {
    if (o.unlimited) return "none";
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g%%", o.budget * 100);
    return buf;
}

Profile build_profile(const RecordOptions& o, SharedSession& session, const Daemon& daemon, Symbolizer& symbolizer,
                      const std::vector<MeasuredEvent>& measured, const std::vector<UnavailableEvent>& unavailable,
                      pid_t pid, std::uint64_t duration_ns) {
    Profile p;
    const auto& h = session.header();
    learn_modules_from_handler(h, symbolizer);
    // Events: asked-for order, measured ones first as they sit in the table.
    for (std::size_t e = 0; e < measured.size(); e++) {
        const int status = h.event_status[e].load();
        const auto backend = measured[e].source.backend;
        EventColumn c{measured[e].name, status == FPERF_EVENT_MEASURED, "", backend_name(backend)};
        if (status == FPERF_EVENT_UNAVAILABLE)
            c.reason = backend == FPERF_BACKEND_KERNEL && h.event_errno[e]
                           ? std::string("the kernel refused it inside the target (perf_event_open: ") +
                                 std::strerror(h.event_errno[e]) + ")"
                           : std::string(backend == FPERF_BACKEND_KERNEL ? "the kernel" : "PAPI") +
                                 " refused it inside the target";
        if (status == FPERF_EVENT_UNTRIED) c.reason = "no sample was taken in the target";
        p.events.push_back(c);
    }
    for (const auto& u : unavailable) p.events.push_back({u.name, false, u.reason, ""});

    std::uint64_t calls = 0, samples = 0, called = 0, sampled = 0;
    for (const auto& s : session.snapshot()) {
        FunctionProfile f;
        f.address = s.address;
        std::tie(f.name, f.module) = symbolizer.name(s.address);
        f.calls = s.calls;
        f.samples = s.samples;
        f.wall_ns = s.wall_ns;
        f.cpu_ns = s.cpu_ns;
        for (std::size_t e = 0; e < p.events.size(); e++) f.events.push_back(e < measured.size() ? s.events[e] : 0);
        calls += f.calls;
        samples += f.samples;
        called += f.calls > 0;
        sampled += f.samples > 0;
        p.functions.push_back(std::move(f));
    }
    std::string command;
    for (const auto& a : o.command) command += (command.empty() ? "" : " ") + a;
    if (command.empty()) command = exe_of(pid);
    auto num = [](double v) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.6g", v);
        return std::string(buf);
    };
    p.meta["pid"] = std::to_string(pid);
    if (!command.empty()) p.meta["command"] = command;
    p.meta["budget"] = format_budget(o);
    p.meta["interval_ns"] = std::to_string(o.interval_ns);
    p.meta["duration_ns"] = std::to_string(duration_ns);
    p.meta["intervals"] = std::to_string(daemon.result().intervals);
    p.meta["sample_cost_ns"] = num(daemon.costs().sample_ns);
    p.meta["count_cost_ns"] = num(daemon.costs().count_ns);
    p.meta["switch_cost_ns"] = num(daemon.costs().switch_ns);
    p.meta["target_switches"] = std::to_string(daemon.result().switches);
    p.meta["cost_source"] = daemon.costs().source;
    p.meta["wall_floor_ns"] = std::to_string(h.wall_floor_ns);
    p.meta["cpu_floor_ns"] = std::to_string(h.cpu_floor_ns);
    p.meta["total_calls"] = std::to_string(calls);
    p.meta["total_samples"] = std::to_string(samples);
    p.meta["functions_called"] = std::to_string(called);
    p.meta["functions_sampled"] = std::to_string(sampled);
    // Against the target's own work when its CPU time was known (what the
    // budget is about), else against wall time.
    const double overhead = overhead_ns(daemon.budget(), samples, calls);
    const auto& r = daemon.result();
    const bool per_work = r.cpu_known && r.intervals > 0 && r.work_ns > 0;
    const double work = per_work ? static_cast<double>(r.work_ns) : static_cast<double>(duration_ns);
    p.meta["overhead_estimate"] = num(work > 0 ? (per_work ? r.overhead_ns : overhead) / work : 0);
    p.meta["overhead_base"] = per_work ? "target CPU work" : "wall time";
    p.meta["target_work_ns"] = std::to_string(per_work ? r.work_ns : duration_ns);
    p.meta["overhead_of_wall"] = num(duration_ns ? overhead / static_cast<double>(duration_ns) : 0);
    p.meta["handler_threads"] = std::to_string(h.threads.load());
    p.meta["thread_failures"] = std::to_string(h.thread_failures.load());
    p.meta["table_full"] = std::to_string(h.table_full.load());
    p.meta["stack_overflow"] = std::to_string(h.stack_overflow.load());
    p.meta["reentrant_skips"] = std::to_string(h.reentrant_skips.load());
    p.meta["stale_skips"] = std::to_string(h.stale_skips.load());
    p.meta["unmatched_exits"] = std::to_string(h.unmatched_exits.load());
    if (h.handler_message[0]) p.meta["handler_message"] = std::string(h.handler_message, strnlen(h.handler_message, sizeof h.handler_message));
    return p;
}

// Takes the probes of functions whose counting alone would break the
// budget out of the target (they keep the samples they have).  A removal
// stops the target and takes 15-120 ms of wall time on a loaded machine, in
// which a new phase's hot functions would all be counted: their handler
// stops counting them at once (FPERF_QUOTA_SHED), the removal follows.
void remove_hot_probes(const ProbeRouting& routing, SharedSession& session, const std::vector<HotFunction>& hot,
                       const std::map<std::uint64_t, std::string>& raw_names, std::set<std::uint64_t>& removed,
                       const Log& log) {
    std::set<std::string> names;
    std::vector<HotFunction> going;
    for (const auto& f : hot) {
        const auto it = raw_names.find(f.address);
        if (it == raw_names.end() || removed.count(f.address)) continue;
        names.insert(it->second);
        going.push_back(f);
    }
    if (going.empty()) return;
    for (const auto& f : going) session.set_quota(f.slot, FPERF_QUOTA_SHED);
    if (!unroute_probes(routing.only(names))) {
        for (const auto& f : going) session.set_quota(f.slot, 0);  // still probed: counted again
        return;
    }
    for (const auto& f : going) removed.insert(f.address);
    std::string said;
    std::size_t n = 0;
    for (const auto& name : names)
        if (n++ < 5) said += (said.empty() ? "" : ", ") + name;
    if (names.size() > 5) said += ", ...";
    log("removed the probes of %zu hot functions (%s): counting them alone would exceed the budget",
        going.size(), said.c_str());
}

void sleep_ns(std::uint64_t ns) {
    timespec ts{static_cast<time_t>(ns / 1'000'000'000ull), static_cast<long>(ns % 1'000'000'000ull)};
    ::nanosleep(&ts, nullptr);
}

}  // namespace

std::string default_handler_library() {
    if (const char* env = std::getenv("FPERF_HANDLER"); env && *env) return env;
    const auto& layout = InstallLayout::current();
    return layout.library("libfperf-handler.so").value_or(layout.lib() / "libfperf-handler.so").string();
}

namespace {

// Events first: a bad --strict request changes nothing.
EventChoice choose_events(const RecordOptions& o, const Log& log) {
    const auto requested = o.events_given ? o.events : default_events();
    auto choice = resolve_events(requested);
    std::string defaults_missing;
    for (const auto& u : choice.unavailable) {
        if (o.events_given)
            std::fprintf(stderr, "fperf: %s: event %s is unavailable: %s\n", o.strict ? "error" : "warning",
                         u.name.c_str(), u.reason.c_str());
        else
            defaults_missing += (defaults_missing.empty() ? "" : ", ") + u.name;
    }
    if (!defaults_missing.empty())
        log("not countable here, so not measured: %s (%s)", defaults_missing.c_str(),
            choice.unavailable.front().reason.c_str());
    if (o.strict && !choice.unavailable.empty())
        throw Error("unavailable events asked for with --strict; nothing recorded (`fperf events` lists what "
                    "this machine can count)",
                    ExitCode::unavailable);
    if (o.events_given && !choice.unavailable.empty())
        log("measuring %s plus wall and CPU time per call",
            choice.measured.empty() ? "no counter event" : ("the available events (" + std::to_string(choice.measured.size()) + ")").c_str());
    return choice;
}

SessionConfig session_config(const RecordOptions& o, const EventChoice& choice) {
    SessionConfig config;
    config.slot_count = o.table_slots;
    config.events = choice.measured;
    config.initial_quota = o.unlimited ? kUnlimitedQuota : 1;
    config.heartbeat_timeout_ns = std::max<std::uint64_t>(1'000'000'000ull, 20 * o.interval_ns);
    config.table_mode = o.function_globs.empty() ? FPERF_TABLE_OPEN : FPERF_TABLE_REGISTERED_ONLY;
    return config;
}

void stop_on_signals() {
    struct sigaction sa{};
    sa.sa_handler = on_stop_signal;
    ::sigaction(SIGINT, &sa, nullptr);
    ::sigaction(SIGTERM, &sa, nullptr);
    ::sigaction(SIGHUP, &sa, nullptr);
}

// The process being profiled, its session and its executable.
struct Profiled {
    std::optional<Target> target;
    SharedSession session;
    std::string exe;
};

// Runs the command stopped right after the handler is loaded, so no call
// happens before the session exists.
Profiled start_command(const RecordOptions& o, const std::string& handler, const SessionConfig& config,
                       Symbolizer& symbolizer) {
    Profiled p;
    int go_fd = -1;
    const pid_t pid = spawn_stopped_later(o.command, handler, go_fd);
    iprobe::UniqueFd go(go_fd);
    p.target.emplace(pid, true);
    try {
        p.session = SharedSession::create(pid, config);
    } catch (...) {
        go.reset();  // the child exits 126 without running the program
        p.target->wait_exit();
        throw;
    }
    const char byte = 1;
    if (::write(go.get(), &byte, 1) != 1) iprobe::throw_errno("cannot start the program");
    go.reset();
    int status = 0;
    pid_t r;
    while ((r = ::waitpid(pid, &status, WUNTRACED)) < 0 && errno == EINTR) {
    }
    if (r == pid && !WIFSTOPPED(status)) {
        if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
            throw Error("cannot run " + o.command.front(), ExitCode::not_found);
        throw Error(o.command.front() + " " + describe_status(status) +
                        " before the handler attached (is it statically linked? the handler is loaded with "
                        "LD_PRELOAD)",
                    ExitCode::failure);
    }
    p.exe = exe_of(pid);
    learn_modules_from_handler(p.session.header(), symbolizer);
    return p;
}

Profiled join_process(const RecordOptions& o, const SessionConfig& config) {
    Profiled p;
    p.target.emplace(o.pid, false);
    if (!p.target->alive()) throw Error("no process " + std::to_string(o.pid), ExitCode::not_found);
    p.exe = exe_of(o.pid);
    if (p.exe.empty())
        throw Error("cannot read /proc/" + std::to_string(o.pid) + "/exe (no permission?)", ExitCode::permission);
    p.session = SharedSession::create(o.pid, config);
    return p;
}

// How the program's calls reach the handler: through hotpatch for a
// coldpatched program, as they are for live -finstrument-functions hooks
// with the handler preloaded.
struct Routing {
    std::optional<ProbeRouting> routed;
    std::map<std::uint64_t, std::string> raw_names;  // raw symbol per run-time address: what hotpatch selects by
};

Routing select_and_route(const RecordOptions& o, const std::string& handler, Profiled& p, Symbolizer& symbolizer,
                         const Log& log) {
    const pid_t pid = p.target->pid();
    const bool handler_present = handler_mapped(pid, handler);
    const auto probes = try_probe_list(o.probe_sources, p.exe, !o.probe_sources.empty() || !handler_present);
    const auto bias = load_bias(pid, p.exe);
    if (bias) {
        std::size_t registered = 0;
        for (const auto& f : candidate_functions(probes, p.exe, o.function_globs)) {
            symbolizer.add_known(*bias + f.link_address, f.name, p.exe);
            if (!o.function_globs.empty()) registered += p.session.register_function(*bias + f.link_address);
        }
        if (!o.function_globs.empty()) {
            if (registered == 0) {
                if (p.target->is_child()) ::kill(pid, SIGKILL);
                throw Error("no function of " + p.exe + " matches --functions", ExitCode::not_found);
            }
            log("%zu functions selected", registered);
        }
    }
    Routing routing;
    if (!probes) return routing;
    if (bias)
        for (const auto& probe : probes->probes)
            if (probe.kind == iprobe::probelist::ProbeKind::entry) routing.raw_names.emplace(*bias + probe.function_address, probe.function);
    // Selected here, once, from the lists loaded here: hotpatch is handed
    // the probes, not paths and globs to load and match again.
    std::vector<std::pair<std::string, iprobe::probelist::ProbeList>> lists;
    lists.emplace_back(o.probe_sources.empty() ? p.exe : o.probe_sources.front(), *probes);
    for (std::size_t i = 1; i < o.probe_sources.size(); ++i)
        lists.emplace_back(o.probe_sources[i], iprobe::probelist::load_probes(o.probe_sources[i]));
    ProbeRouting r;
    r.pid = pid;
    r.selections = ProbeRouting::select(lists, o.function_globs);
    r.handler_library = handler;
    if (r.selections.empty()) {
        if (p.target->is_child()) ::kill(pid, SIGKILL);
        throw Error("no probe of " + lists.front().first + " matches --functions", ExitCode::not_found);
    }
    try {
        const auto routed = route_probes(r);
        log("%zu probes routed to the handler%s (pause %" PRIu64 " us)", routed.probes_enabled,
            routed.handler_injected ? ", handler injected" : "", routed.pause_us);
    } catch (...) {
        if (p.target->is_child()) ::kill(pid, SIGKILL);
        throw;
    }
    routing.routed = r;
    return routing;
}

void wait_for_handler(Profiled& p, const Log& log) {
    if (p.session.handler_ready()) return;
    for (int i = 0; i < 200 && !p.session.handler_ready() && p.target->alive(); i++) sleep_ns(10'000'000);
    if (!p.session.handler_ready())
        log("the handler has not attached yet (it looks for the session every 64k calls); costs estimated here");
}

// Refills quotas every interval and sheds probes of functions too hot for
// the budget until the duration ends, a signal comes or the target exits.
// Returns how long it ran.
std::uint64_t run_budget_loop(const RecordOptions& o, Daemon& daemon, Profiled& p, const Routing& routing,
                              std::set<std::uint64_t>& removed, const Log& log) {
    const pid_t pid = p.target->pid();
    const std::uint64_t start = monotonic_ns();
    const std::uint64_t deadline = o.duration_s > 0 ? start + static_cast<std::uint64_t>(o.duration_s * 1e9) : 0;
    std::uint64_t last_refill = start;
    // Until the first refill every function is counted, the hottest ones at
    // a cost far above the budget: the first intervals are short (10 ms,
    // doubling up to --interval) so those are found and shed at once.
    std::uint64_t interval_ns = std::min<std::uint64_t>(o.interval_ns, 10'000'000);
    const bool progress = !o.quiet && ::isatty(STDERR_FILENO);
    std::uint64_t last_progress = start;
    std::optional<TargetRun> last_run = target_run(pid);
    std::uint64_t last_poll = start;
    std::optional<TargetRun> last_poll_run = last_run;
    const bool removable = routing.routed.has_value() && !o.unlimited && !o.keep_probes;
    while (!g_stop_signal && p.target->alive()) {
        const std::uint64_t now = monotonic_ns();
        if (deadline && now >= deadline) break;
        if (now - last_refill >= interval_ns) {
            const auto run = target_run(pid);
            const bool known = run && last_run;
            const auto hot = daemon.refill(now - last_refill, known ? std::optional(run->cpu_ns - last_run->cpu_ns) : std::nullopt,
                                           known ? run->switches - last_run->switches : 0, removable);
            last_run = run;
            if (!hot.empty()) remove_hot_probes(*routing.routed, p.session, hot, routing.raw_names, removed, log);
            daemon.publish_quotas();
            last_refill = monotonic_ns();
            interval_ns = std::min(o.interval_ns, 2 * interval_ns);
        } else if (removable && now - last_poll >= 5'000'000) {
            const auto run = target_run(pid);
            const auto hot = daemon.newly_hot(now - last_poll, run && last_poll_run
                                                                   ? std::optional(run->cpu_ns - last_poll_run->cpu_ns)
                                                                   : std::nullopt);
            last_poll = now;
            last_poll_run = run;
            if (!hot.empty()) remove_hot_probes(*routing.routed, p.session, hot, routing.raw_names, removed, log);
        }
        if (progress && now - last_progress >= 1'000'000'000ull) {
            const auto& r = daemon.result();
            std::fprintf(stderr, "\rfperf: %.0fs  %" PRIu64 " functions  %" PRIu64 " calls  %" PRIu64
                                 " samples  est. overhead %.2f%%   ",
                         static_cast<double>(now - start) / 1e9, r.functions, r.calls, r.samples,
                         100.0 * overhead_ns(daemon.budget(), r.samples, r.calls) / static_cast<double>(now - start));
            last_progress = now;
        }
        sleep_ns(std::min<std::uint64_t>(interval_ns, 10'000'000));
    }
    if (progress && last_progress != start) std::fputc('\n', stderr);
    return monotonic_ns() - start;
}

void mark_removed_probes(Profile& profile, const std::set<std::uint64_t>& removed) {
    if (removed.empty()) return;
    std::string list;
    for (const auto a : removed) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%s%" PRIx64, list.empty() ? "" : ",", a);
        list += buf;
    }
    profile.meta["probes_removed"] = list;
    for (auto& f : profile.functions) f.probes_removed = removed.count(f.address) > 0;
}

void log_summary(const RecordOptions& o, const Profile& profile, Profiled& p, bool target_gone, const Log& log) {
    log("%s functions called, %s sampled; %s calls, %s samples; estimated overhead %.2f%%",
        profile.get("functions_called").c_str(), profile.get("functions_sampled").c_str(),
        profile.get("total_calls").c_str(), profile.get("total_samples").c_str(),
        profile.number("overhead_estimate") * 100);
    if (target_gone && p.target->is_child())
        log("%s %s", o.command.front().c_str(), describe_status(p.target->exit_status()).c_str());
    else if (target_gone)
        log("pid %d exited", p.target->pid());
    log("wrote %s (see `fperf report -i %s`)", o.output.c_str(), o.output.c_str());
}

}  // namespace

int record(const RecordOptions& o) {
    const Log log(o.quiet);
    if ((o.pid != 0) == !o.command.empty())
        throw Error("give either --pid PID or -- PROGRAM [ARGS], not both", ExitCode::usage);
    const std::string handler = o.handler_library.empty() ? default_handler_library() : o.handler_library;
    if (::access(handler.c_str(), R_OK) != 0)
        throw Error("handler library " + handler + " not found (build target fperf-handler, or set FPERF_HANDLER)",
                    ExitCode::not_found);
    if (o.pid != 0 && ::kill(o.pid, 0) != 0 && errno == ESRCH)
        throw Error("no process " + std::to_string(o.pid), ExitCode::not_found);
    const EventChoice choice = choose_events(o, log);
    const SessionConfig config = session_config(o, choice);
    stop_on_signals();
    // Before the target is touched: while it runs, a handler waiting for
    // the daemon's first heartbeat would take this time for a dead daemon.
    const double switch_ns = o.unlimited ? 0 : measure_switch_cost_ns(choice.measured);

    Symbolizer symbolizer;
    Profiled p = o.command.empty() ? join_process(o, config) : start_command(o, handler, config, symbolizer);
    const pid_t pid = p.target->pid();
    learn_modules_from_maps(pid, symbolizer);
    const Routing routing = select_and_route(o, handler, p, symbolizer, log);
    wait_for_handler(p, log);

    Budget budget;
    budget.unlimited = o.unlimited;
    budget.fraction = o.budget;
    budget.work_ns = o.interval_ns;
    Costs costs =
        p.session.handler_ready() ? costs_from_handler(p.session.header()) : estimate_costs_in_process(choice.measured);
    costs.switch_ns = switch_ns;
    Daemon daemon(p.session, budget, costs, choice.measured);
    log("cost per sample %.0f ns, per counted call %.1f ns, per context switch with counters open %.0f ns (%s); "
        "budget %s",
        costs.sample_ns, costs.count_ns, costs.switch_ns, costs.source.c_str(), format_budget(o).c_str());

    p.session.heartbeat();
    p.session.set_state(FPERF_STATE_ACTIVE);
    if (p.target->is_child()) ::kill(pid, SIGCONT);
    log("recording pid %d%s; Ctrl-C stops", pid, o.duration_s > 0 ? " for the given duration" : "");
    std::set<std::uint64_t> removed;
    const std::uint64_t duration = run_budget_loop(o, daemon, p, routing, removed, log);
    const bool target_gone = !p.target->alive();

    // Stop sampling first, then take the probes away, then read the table:
    // whatever the handler still adds is a call count, never a half sample.
    p.session.freeze();
    if (routing.routed && !target_gone) unroute_probes(*routing.routed);
    learn_modules_from_handler(p.session.header(), symbolizer);
    auto profile = build_profile(o, p.session, daemon, symbolizer, choice.measured, choice.unavailable, pid, duration);
    mark_removed_probes(profile, removed);
    if (target_gone && p.target->is_child()) profile.meta["exit"] = describe_status(p.target->exit_status());
    p.session.close();
    profile.save(o.output);
    log_summary(o, profile, p, target_gone, log);

    if (p.target->is_child() && !target_gone) {
        if (g_stop_signal) ::kill(pid, g_stop_signal);
        log("profiling stopped; waiting for %s to exit", o.command.front().c_str());
        p.target->wait_exit();
    }
    if (profile.get("total_calls") == "0")
        log("no call was seen: was the program built with -finstrument-functions (iprobe-cc)?");
    return 0;
}

} // namespace iprobe::fperf
