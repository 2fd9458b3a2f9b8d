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

extern char** environ;

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

struct Mapping {
    std::uint64_t start = 0, end = 0, offset = 0;
    std::string path;
};

std::vector<Mapping> read_maps(pid_t pid) {
    std::vector<Mapping> out;
    std::ifstream in("/proc/" + std::to_string(pid) + "/maps");
    std::string line;
    while (std::getline(in, line)) {
        Mapping m;
        char perms[8] = {};
        unsigned long long start = 0, end = 0, offset = 0;
        int path_at = 0;
        if (std::sscanf(line.c_str(), "%llx-%llx %7s %llx %*s %*s %n", &start, &end, perms, &offset, &path_at) < 4)
            continue;
        m.start = start;
        m.end = end;
        m.offset = offset;
        if (path_at > 0 && static_cast<std::size_t>(path_at) < line.size()) m.path = line.substr(path_at);
        if (m.path.empty() || m.path[0] != '/') continue;
        out.push_back(std::move(m));
    }
    return out;
}

std::string exe_of(pid_t pid) {
    char buf[PATH_MAX];
    const auto n = ::readlink(("/proc/" + std::to_string(pid) + "/exe").c_str(), buf, sizeof buf - 1);
    if (n <= 0) return {};
    buf[n] = '\0';
    std::string path(buf);
    const std::string deleted = " (deleted)";
    if (path.size() > deleted.size() && path.ends_with(deleted)) path.resize(path.size() - deleted.size());
    return path;
}

// Load bias of `path` in `pid`, from /proc/PID/maps and the ELF headers.
std::optional<std::uint64_t> load_bias(pid_t pid, const std::string& path) {
    const auto vaddr = first_load_vaddr(path);
    if (!vaddr) return std::nullopt;
    std::optional<std::uint64_t> lowest;
    for (const auto& m : read_maps(pid))
        if (m.path == path && (!lowest || m.start < *lowest)) lowest = m.start;
    if (!lowest) return std::nullopt;
    return *lowest - *vaddr;
}

bool handler_mapped(pid_t pid, const std::string& handler) {
    for (const auto& m : read_maps(pid))
        if (m.path == handler) return true;
    return false;
}

// A process we watch: our child (start mode) or anyone's (attach mode).
class Target {
public:
    Target(pid_t pid, bool child) : pid_(pid), child_(child) {}
    pid_t pid() const { return pid_; }
    bool is_child() const { return child_; }
    bool exited() const { return exited_; }
    int exit_status() const { return status_; }

    bool alive() {
        if (exited_) return false;
        if (child_) {
            int status = 0;
            const pid_t r = ::waitpid(pid_, &status, WNOHANG);
            if (r == pid_ && (WIFEXITED(status) || WIFSIGNALED(status))) {
                exited_ = true;
                status_ = status;
            }
            return !exited_;
        }
        if (::kill(pid_, 0) != 0 && errno == ESRCH) {
            exited_ = true;
            return false;
        }
        std::ifstream stat("/proc/" + std::to_string(pid_) + "/stat");
        std::string all((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
        const auto paren = all.rfind(')');
        if (paren == std::string::npos || (paren + 2 < all.size() && (all[paren + 2] == 'Z' || all[paren + 2] == 'X'))) {
            exited_ = true;
            return false;
        }
        return true;
    }

    // Blocks until the child exits (start mode, after recording stopped).
    void wait_exit() {
        if (!child_ || exited_) return;
        int status = 0;
        while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
        }
        exited_ = true;
        status_ = status;
    }

private:
    pid_t pid_;
    bool child_;
    bool exited_ = false;
    int status_ = 0;
};

std::string describe_status(int status) {
    if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
    if (WIFSIGNALED(status)) return std::string("was killed by signal ") + ::strsignal(WTERMSIG(status));
    return "stopped";
}

// ---- which functions, and their names ----

struct NamedFunction {
    std::uint64_t link_address = 0;
    std::string name;
};

std::optional<iprobe::ProbeList> try_probe_list(const std::vector<std::string>& sources, const std::string& exe,
                                                bool required) {
    const std::string source = sources.empty() ? exe : sources.front();
    try {
        return iprobe::load_probes(source);
    } catch (const Error&) {
        if (required) throw;
        return std::nullopt;
    }
}

std::vector<NamedFunction> candidate_functions(const std::optional<iprobe::ProbeList>& probes, const std::string& exe,
                                               const std::vector<std::string>& globs) {
    std::vector<NamedFunction> out;
    auto wanted = [&](const std::string& name) {
        if (globs.empty()) return true;
        for (const auto& g : globs)
            if (iprobe::glob_match(g, name)) return true;
        return false;
    };
    if (probes) {
        std::map<std::uint64_t, std::string> seen;
        for (const auto& p : probes->probes) {
            if (p.kind != iprobe::ProbeKind::entry) continue;
            const std::string& name = p.demangled.empty() ? p.function : p.demangled;
            if (wanted(name) || wanted(p.function)) seen.emplace(p.function_address, name);
        }
        for (auto& [addr, name] : seen) out.push_back({addr, name});
        return out;
    }
    for (const auto& s : read_function_symbols(exe))
        if (wanted(s.name)) out.push_back({s.address, s.name});
    return out;
}

class Symbolizer {
public:
    void add_known(std::uint64_t runtime_address, const std::string& name, const std::string& module) {
        known_[runtime_address] = {name, module};
    }
    void add_module(std::uint64_t start, std::uint64_t end, std::uint64_t bias, const std::string& path) {
        for (const auto& m : modules_)
            if (m.start == start && m.path == path) return;
        modules_.push_back({start, end, bias, path});
    }

    std::pair<std::string, std::string> name(std::uint64_t address) {
        if (const auto it = known_.find(address); it != known_.end()) return it->second;
        for (const auto& m : modules_) {
            if (address < m.start || address >= m.end) continue;
            auto& symbols = symbols_[m.path];
            if (!symbols) symbols = read_function_symbols(m.path);
            if (const auto* s = find_symbol(*symbols, address - m.bias)) return {s->name, m.path};
            return {hex(address), m.path};
        }
        return {hex(address), ""};
    }

private:
    static std::string hex(std::uint64_t a) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "0x%" PRIx64, a);
        return buf;
    }
    struct Module {
        std::uint64_t start, end, bias;
        std::string path;
    };
    std::map<std::uint64_t, std::pair<std::string, std::string>> known_;
    std::vector<Module> modules_;
    std::map<std::string, std::optional<std::vector<FunctionSymbol>>> symbols_;
};

void learn_modules_from_handler(const fperf_shm_header& h, Symbolizer& symbolizer) {
    for (std::uint32_t i = 0; i < h.module_count && i < FPERF_MAX_MODULES; i++) {
        const auto& m = h.modules[i];
        symbolizer.add_module(m.start, m.end, m.bias, std::string(m.path, strnlen(m.path, sizeof m.path)));
    }
}

void learn_modules_from_maps(pid_t pid, Symbolizer& symbolizer) {
    std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> extent;
    for (const auto& m : read_maps(pid)) {
        auto [it, fresh] = extent.emplace(m.path, std::make_pair(m.start, m.end));
        if (!fresh) {
            it->second.first = std::min(it->second.first, m.start);
            it->second.second = std::max(it->second.second, m.end);
        }
    }
    for (const auto& [path, range] : extent)
        if (const auto vaddr = first_load_vaddr(path))
            symbolizer.add_module(range.first, range.second, range.first - *vaddr, path);
}

// ---- costs ----

struct Costs {
    double sample_ns = 0, count_ns = 0;
    std::string source;
};

// Until the handler reports its own measurement: the same reads timed here.
Costs estimate_costs_in_process(const std::vector<MeasuredEvent>& events) {
    EventReader counters(events);
    timespec ts{};
    const int rounds = 2000;
    const auto t0 = monotonic_ns();
    for (int i = 0; i < rounds; i++)
        for (int side = 0; side < 2; side++) {
            counters.read();
            ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
            ::clock_gettime(CLOCK_MONOTONIC, &ts);
        }
    const auto elapsed = monotonic_ns() - t0;
    return {static_cast<double>(elapsed) / rounds, 5.0, "estimated in the fperf process: the handler has not attached"};
}

Costs costs_from_handler(const fperf_shm_header& h) {
    return {static_cast<double>(h.sample_cost_ns), static_cast<double>(h.count_cost_ns),
            "measured in the target by the handler at attach"};
}

// ---- start mode ----

std::string join_env_list(const char* existing, const std::string& add) {
    if (!existing || !*existing) return add;
    return add + ":" + existing;
}

// Forks the program with the handler preloaded; the child waits on `go`
// until the shared memory for its pid exists, then execs; the handler stops
// it with SIGSTOP once attached, so functions can be registered and probes
// routed before main() runs.
pid_t spawn_stopped_later(const std::vector<std::string>& command, const std::string& handler, int& go_fd) {
    int pipe_fds[2];
    if (::pipe2(pipe_fds, O_CLOEXEC) != 0) iprobe::throw_errno("pipe");
    std::vector<std::string> env_strings;
    for (char** e = environ; *e; e++) {
        const std::string_view kv(*e);
        if (kv.starts_with("LD_PRELOAD=") || kv.starts_with("FPERF_STOP_AFTER_INIT=")) continue;
        env_strings.emplace_back(kv);
    }
    std::string preload = handler;
    for (const auto& lib : libraries_to_preload())
        if (::access(lib.c_str(), R_OK) == 0) preload += ":" + lib;
    env_strings.push_back("LD_PRELOAD=" + join_env_list(std::getenv("LD_PRELOAD"), preload));
    env_strings.push_back("FPERF_STOP_AFTER_INIT=1");
    std::vector<char*> envp;
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<char*> argv;
    for (const auto& a : command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);

    const pid_t pid = ::fork();
    if (pid < 0) iprobe::throw_errno("fork");
    if (pid == 0) {
        ::close(pipe_fds[1]);
        char byte = 0;
        if (::read(pipe_fds[0], &byte, 1) != 1) ::_exit(126);  // parent gave up
        ::execvpe(argv[0], argv.data(), envp.data());
        std::fprintf(stderr, "fperf: cannot run %s: %s\n", argv[0], std::strerror(errno));
        ::_exit(127);
    }
    ::close(pipe_fds[0]);
    go_fd = pipe_fds[1];
    return pid;
}

// ---- the daemon ----

struct DaemonResult {
    std::uint64_t intervals = 0;
    std::uint64_t last_allowance = 0;
    std::uint64_t calls = 0, samples = 0, functions = 0;  // as of the last refill
    std::uint64_t work_ns = 0;  // the target's own work, summed over intervals
    double overhead_ns = 0;     // our estimated cost, summed over intervals
    bool cpu_known = true;      // work came from the target's CPU time
};

class Daemon {
public:
    Daemon(SharedSession& session, Budget budget, Costs costs, const std::vector<MeasuredEvent>& events)
        : session_(session), budget_(budget), costs_(std::move(costs)), events_(events) {
        budget_.sample_cost_ns = costs_.sample_ns;
        budget_.count_cost_ns = costs_.count_ns;
    }

    // One refill: see what ran, work out the next interval's quotas (handed
    // out by publish_quotas()).  `cpu_ns`: CPU time the target used in the
    // interval, when known.  Returns the run-time addresses of functions too
    // hot to keep counting (only when `removable`, i.e. their probes can be
    // taken out).
    std::vector<std::uint64_t> refill(std::uint64_t elapsed_ns, std::optional<std::uint64_t> cpu_ns, bool removable) {
        session_.heartbeat();
        if (!handler_costs_ && session_.handler_ready() && session_.header().sample_cost_ns) {
            costs_ = costs_from_handler(session_.header());
            budget_.sample_cost_ns = costs_.sample_ns;
            budget_.count_cost_ns = costs_.count_ns;
            handler_costs_ = true;
        }
        // Once enough real samples were timed in the target, budget with them.
        const auto& hdr = session_.header();
        const std::uint64_t timed = hdr.sampling_count.load(std::memory_order_relaxed);
        if (timed >= 100) {
            budget_.sample_cost_ns = static_cast<double>(hdr.sampling_ns.load(std::memory_order_relaxed)) /
                                     static_cast<double>(timed);
            if (!live_costs_) costs_.source += "; then timed live on real samples";
            live_costs_ = true;
            costs_.sample_ns = budget_.sample_cost_ns;
        }
        // Counted calls likewise: the calibrated count cost is cache-warm, a
        // real site pays the misses too (shm_layout.h, count_warm_ns).
        const std::uint64_t counted = hdr.counting_count.load(std::memory_order_relaxed);
        if (handler_costs_ && counted >= 100) {
            const double live = static_cast<double>(hdr.counting_ns.load(std::memory_order_relaxed)) /
                                static_cast<double>(counted);
            const double misses = std::max(0.0, live - static_cast<double>(hdr.count_warm_ns));
            budget_.count_cost_ns = static_cast<double>(hdr.count_cost_ns) + misses;
            if (!live_count_costs_) costs_.source += "; counted calls timed live";
            live_count_costs_ = true;
            costs_.count_ns = budget_.count_cost_ns;
        }
        const auto snap = session_.snapshot();
        std::uint64_t calls_interval = 0, samples_interval = 0;
        const auto activity = activity_since(snap, previous_calls_, calls_interval);
        const std::uint64_t samples_before = result_.samples;
        result_.calls = result_.samples = 0;
        result_.functions = snap.size();
        for (const auto& s : snap) {
            result_.calls += s.calls;
            result_.samples += s.samples;
        }
        samples_interval = result_.samples >= samples_before ? result_.samples - samples_before : 0;
        // The target's own work: its CPU time less what we cost it.  A
        // target that waits does little work, and gets few samples.
        const double spent = overhead_ns(budget_, samples_interval, calls_interval);
        const std::uint64_t work = own_work(elapsed_ns, cpu_ns, spent);
        result_.work_ns += work;
        result_.overhead_ns += spent;
        result_.cpu_known = result_.cpu_known && cpu_ns.has_value();
        Budget b = budget_;
        b.work_ns = work;
        b.debt_ns = result_.overhead_ns - budget_.fraction * static_cast<double>(result_.work_ns);
        result_.last_allowance = sample_allowance(b, calls_interval);
        const auto quotas = allocate_quotas(activity, result_.last_allowance);
        pending_quotas_.clear();
        for (std::size_t i = 0; i < snap.size(); i++) pending_quotas_.emplace_back(snap[i].slot, quotas[i]);
        result_.intervals++;
        std::vector<std::uint64_t> hot;
        if (removable)
            for (const auto i : probes_to_remove(activity, b)) hot.push_back(snap[i].address);
        return hot;
    }

    // Between refills, every poll: functions that turned hot since the last
    // look (the target entered a new phase) are shed now rather than counted
    // at full cost until the next refill.
    std::vector<std::uint64_t> newly_hot(std::uint64_t elapsed_ns, std::optional<std::uint64_t> cpu_ns) {
        const auto snap = session_.snapshot();
        std::uint64_t calls = 0;
        const auto activity = activity_since(snap, polled_calls_, calls);
        Budget b = budget_;
        b.work_ns = own_work(elapsed_ns, cpu_ns, overhead_ns(budget_, 0, calls));
        std::vector<std::uint64_t> hot;
        for (const auto i : probes_to_remove(activity, b)) hot.push_back(snap[i].address);
        return hot;
    }

    // After the hot functions' probes are gone: removing them stops the
    // target, and a sample opened on a fresh quota just before would lose
    // its exit (a function never sampled would then stay unsampled).
    void publish_quotas() {
        for (const auto& [slot, quota] : pending_quotas_) session_.set_quota(slot, quota);
        pending_quotas_.clear();
    }

    const Costs& costs() const { return costs_; }
    const Budget& budget() const { return budget_; }
    const DaemonResult& result() const { return result_; }

private:
    // The target's own work over a stretch: its CPU time (wall time when
    // unknown) less what we are estimated to have cost it.
    static std::uint64_t own_work(std::uint64_t elapsed_ns, std::optional<std::uint64_t> cpu_ns, double spent_ns) {
        const double used = cpu_ns ? static_cast<double>(*cpu_ns) : static_cast<double>(elapsed_ns);
        return used > spent_ns ? static_cast<std::uint64_t>(used - spent_ns) : 0;
    }

    // What each function did since `previous` was last updated (calls per
    // slot); `calls` gets their sum.
    static std::vector<FunctionActivity> activity_since(const std::vector<SlotSnapshot>& snap,
                                                        std::map<std::uint32_t, std::uint64_t>& previous,
                                                        std::uint64_t& calls) {
        std::vector<FunctionActivity> activity;
        activity.reserve(snap.size());
        for (const auto& s : snap) {
            auto& prev = previous[s.slot];
            const std::uint64_t delta = s.calls >= prev ? s.calls - prev : s.calls;
            prev = s.calls;
            activity.push_back({s.calls, delta, s.samples});
            calls += delta;
        }
        return activity;
    }

    SharedSession& session_;
    Budget budget_;
    Costs costs_;
    std::vector<MeasuredEvent> events_;
    bool handler_costs_ = false;
    bool live_costs_ = false;
    bool live_count_costs_ = false;
    std::map<std::uint32_t, std::uint64_t> previous_calls_, polled_calls_;
    std::vector<std::pair<std::uint32_t, std::int64_t>> pending_quotas_;
    DaemonResult result_;
};

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

// CPU time of all the target's threads (schedstat: ns, unlike /proc/PID/stat's ticks).
std::optional<std::uint64_t> target_cpu_ns(pid_t pid) {
    const std::string dir = "/proc/" + std::to_string(pid) + "/task";
    std::error_code ec;
    std::uint64_t total = 0;
    bool any = false;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
        std::ifstream in(entry.path() / "schedstat");
        unsigned long long on_cpu = 0;
        if (in >> on_cpu) {
            total += on_cpu;
            any = true;
        }
    }
    if (!any) return std::nullopt;
    return total;
}

// Takes the probes of functions whose counting alone would break the
// budget out of the target (they keep the samples they have).
void remove_hot_probes(const ProbeRouting& routing, const std::vector<std::uint64_t>& hot,
                       const std::map<std::uint64_t, std::string>& raw_names, std::set<std::uint64_t>& removed,
                       const Log& log) {
    ProbeRouting these = routing;
    these.function_globs.clear();
    std::vector<std::uint64_t> addresses;
    for (const auto a : hot) {
        const auto it = raw_names.find(a);
        if (it == raw_names.end() || removed.count(a)) continue;
        these.function_globs.push_back(it->second);
        addresses.push_back(a);
    }
    if (addresses.empty()) return;
    if (!unroute_probes(these)) return;
    removed.insert(addresses.begin(), addresses.end());
    std::string names;
    for (std::size_t i = 0; i < these.function_globs.size() && i < 5; i++)
        names += (i ? ", " : "") + these.function_globs[i];
    if (these.function_globs.size() > 5) names += ", ...";
    log("removed the probes of %zu hot functions (%s): counting them alone would exceed the budget",
        addresses.size(), names.c_str());
}

void sleep_ns(std::uint64_t ns) {
    timespec ts{static_cast<time_t>(ns / 1'000'000'000ull), static_cast<long>(ns % 1'000'000'000ull)};
    ::nanosleep(&ts, nullptr);
}

}  // namespace

std::string default_handler_library() {
    if (const char* env = std::getenv("FPERF_HANDLER"); env && *env) return env;
    char self[PATH_MAX];
    const auto n = ::readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return "libfperf-handler.so";
    self[n] = '\0';
    std::string dir(self);
    dir.resize(dir.rfind('/'));  // .../bin
    dir.resize(dir.rfind('/'));
    for (const char* sub : {"/lib/libfperf-handler.so", "/lib/iprobe/libfperf-handler.so"})
        if (::access((dir + sub).c_str(), R_OK) == 0) return dir + sub;
    return dir + "/lib/libfperf-handler.so";
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
            if (probe.kind == iprobe::ProbeKind::entry) routing.raw_names.emplace(*bias + probe.function_address, probe.function);
    ProbeRouting r;
    r.pid = pid;
    r.probe_sources = o.probe_sources.empty() ? std::vector<std::string>{p.exe} : o.probe_sources;
    r.function_globs = o.function_globs;
    r.handler_library = handler;
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
    std::optional<std::uint64_t> last_cpu = target_cpu_ns(pid);
    std::uint64_t last_poll = start;
    std::optional<std::uint64_t> last_poll_cpu = last_cpu;
    const bool removable = routing.routed.has_value() && !o.unlimited && !o.keep_probes;
    while (!g_stop_signal && p.target->alive()) {
        const std::uint64_t now = monotonic_ns();
        if (deadline && now >= deadline) break;
        if (now - last_refill >= interval_ns) {
            const auto cpu = target_cpu_ns(pid);
            const auto hot = daemon.refill(now - last_refill,
                                           cpu && last_cpu ? std::optional(*cpu - *last_cpu) : std::nullopt, removable);
            last_cpu = cpu;
            if (!hot.empty()) remove_hot_probes(*routing.routed, hot, routing.raw_names, removed, log);
            daemon.publish_quotas();
            last_refill = monotonic_ns();
            interval_ns = std::min(o.interval_ns, 2 * interval_ns);
        } else if (removable && now - last_poll >= 5'000'000) {
            const auto cpu = target_cpu_ns(pid);
            const auto hot = daemon.newly_hot(now - last_poll,
                                              cpu && last_poll_cpu ? std::optional(*cpu - *last_poll_cpu) : std::nullopt);
            last_poll = now;
            last_poll_cpu = cpu;
            if (!hot.empty()) remove_hot_probes(*routing.routed, hot, routing.raw_names, removed, log);
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
    const Costs costs =
        p.session.handler_ready() ? costs_from_handler(p.session.header()) : estimate_costs_in_process(choice.measured);
    Daemon daemon(p.session, budget, costs, choice.measured);
    log("cost per sample %.0f ns, per counted call %.1f ns (%s); budget %s", costs.sample_ns, costs.count_ns,
        costs.source.c_str(), format_budget(o).c_str());

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
