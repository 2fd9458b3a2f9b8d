#include "iprobe/hotpatch/output.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "iprobe/hotpatch/agent_protocol.h"
#include "iprobe/hotpatch/attach_report.h"
#include "iprobe/hotpatch/histogram.h"
#include "iprobe/support/error.h"
#include "iprobe/support/json.h"

namespace iprobe::hotpatch {
namespace {

// Why returns went unhooked, for people: the pool taken by other threads
// (counted apart by the runtime), else a thread deeper than its return stack
// (or one exiting, or a hook inside the return stack's own slow path).
std::string unhooked_why(std::uint64_t unhooked, std::uint64_t pool_empty) {
    std::ostringstream why;
    if (pool_empty)
        why << pool_empty << " in threads that found the runtime's return pool held by other threads (it serves "
            << IPROBE_RT_RETURN_POOL_THREADS << " threads making hooked calls at once)";
    if (pool_empty && unhooked > pool_empty) why << "; ";
    if (unhooked > pool_empty)
        why << unhooked - pool_empty << " deeper than a thread's " << IPROBE_RT_RETURN_STACK_FRAMES
            << "-frame return stack (or made while it exited)";
    return why.str();
}

constexpr std::string_view kFormatNames[] = {"text", "json", "chrome", "folded", "prometheus"};
constexpr std::string_view kResultNames[] = {"an attach", "a detach", "a status", "a report", "a reset", "folded stacks",
                                             "a trace"};

std::string hex(std::uint64_t v) {
    char buf[24];
    std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
    return buf;
}

// Percent of the time since the first attach that a function's probes were on.
std::string probed_percent(const FunctionStats& f, std::uint64_t now) {
    if (!f.window_start_ns || now <= f.window_start_ns) return "-";
    const double share = static_cast<double>(f.probed_ns(now)) / static_cast<double>(now - f.window_start_ns);
    char buf[16];
    std::snprintf(buf, sizeof buf, "%.0f%%", 100.0 * std::min(share, 1.0));
    return buf;
}

class TextOutput final : public Output {
public:
    using Output::Output;
    void attached(const AttachResult& r) override { out_ << attach_summary(r.stats, r.pid) << "\n"; }
    void detached(const DetachResult& r) override {
        out_ << "disabled " << r.stats.disabled << " probes in process " << r.pid << " (" << r.stats.still_enabled
             << " still on): " << r.stats.sites_restored << " sites restored from the probe lists; " << r.stats.threads
             << " threads stopped for " << r.stats.pause_us << " us\n";
        if (r.stats.exits_lost)
            out_ << "  " << r.stats.exits_lost
                 << " calls in flight lose their exit (their exit hooks are off, their returns not hooked): not in "
                    "`completed` (report: exits_lost_at_detach)\n";
    }
    void status(const StatusResult& r) override;
    void report(const ReportResult& r) override;
    void reset(const ResetResult& r) override {
        out_ << "reset: the next 'iprobe report " << r.pid << " --since-last' counts from now\n";
    }
    void trace(const TraceRecord& r) override { out_ << trace_text_line(r); }
    void trace_begin(pid_t) override {}
    void trace_end() override { out_.flush(); }

private:
    OutputFormat format() const override { return OutputFormat::text; }
};

class JsonOutput final : public Output {
public:
    using Output::Output;
    void attached(const AttachResult& r) override { out_ << to_json(r.stats, r.pid) << "\n"; }
    void detached(const DetachResult& r) override { out_ << to_json(r.stats, r.pid) << "\n"; }
    void status(const StatusResult& r) override;
    void report(const ReportResult& r) override;
    void reset(const ResetResult& r) override {
        JsonWriter j;
        j.begin_object().field("pid", static_cast<std::int64_t>(r.pid)).field("reset", true).end_object();
        out_ << j.str() << "\n";
    }
    void trace_begin(pid_t) override {}
    void trace(const TraceRecord& r) override { out_ << to_json(r) << "\n"; }
    void trace_end() override { out_.flush(); }

private:
    OutputFormat format() const override { return OutputFormat::json; }
};

// Chrome trace-event JSON (Perfetto opens it): one array of B/E/i events.
class ChromeOutput final : public Output {
public:
    using Output::Output;
    void trace_begin(pid_t pid) override {
        pid_ = pid;
        first_ = true;
        out_ << "{\"traceEvents\":[\n";
    }
    void trace(const TraceRecord& r) override {
        // calls a detach left without their exits: their spans end at the detach
        for (const std::string& f : r.exits_closed) {
            JsonWriter e;
            e.begin_object()
                .field("name", f)
                .field("ph", "E")
                .field("ts", static_cast<double>(r.exits_lost_ns) / 1000.0)
                .field("pid", static_cast<std::int64_t>(pid_))
                .field("tid", r.tid);
            e.key("args").begin_object().field("exit_lost_at_detach", true).end_object();
            e.end_object();
            out_ << (first_ ? "" : ",\n") << e.str();
            first_ = false;
        }
        JsonWriter j;
        j.begin_object()
            .field("name", r.function)
            // an entry whose exit is not traced is an instant: a "B" would stay open to the end
            .field("ph", r.kind == probelist::ProbeKind::entry && r.exit_traced ? "B"
                         : r.kind == probelist::ProbeKind::exit               ? "E"
                                                                              : "i")
            // not stamped (--no-durations): the span ends at the latest time known before its exit
            .field("ts", static_cast<double>(r.time_ns) / 1000.0)
            .field("pid", static_cast<std::int64_t>(pid_))
            .field("tid", r.tid);
        const bool arguments = r.kind == probelist::ProbeKind::entry && r.has_arguments;
        if (arguments || r.retval || !r.backtrace.empty() || r.unwound || !r.stamped || r.dropped_before ||
            r.exits_lost_before) {
            j.key("args").begin_object();
            if (r.unwound) j.field("unwound", true);
            if (!r.stamped) j.field("end_not_recorded", true);
            if (r.dropped_before) j.field("dropped_before", r.dropped_before);
            if (r.exits_lost_before) j.field("exits_lost_before", r.exits_lost_before);
            if (arguments)
                for (const Value& v : r.arguments) j.key(v.name).raw(v.json.empty() ? "null" : v.json);
            if (r.retval) j.key("retval").raw(r.retval->json.empty() ? "null" : r.retval->json);
            if (!r.backtrace.empty()) {
                j.key("backtrace").begin_array();
                for (const Frame& f : r.backtrace) j.value(f.function.empty() ? hex(f.address) : f.function);
                j.end_array();
            }
            j.end_object();
        }
        j.end_object();
        out_ << (first_ ? "" : ",\n") << j.str();
        first_ = false;
    }
    void trace_end() override { out_ << "\n]}\n" << std::flush; }

private:
    OutputFormat format() const override { return OutputFormat::chrome; }
    pid_t pid_ = 0;
    bool first_ = true;
};

// flamegraph.pl's input: "outer;inner;leaf NANOSECONDS" a line.
class FoldedOutput final : public Output {
public:
    using Output::Output;
    void folded(const FoldedStacks& stacks) override {
        for (const auto& [path, ns] : stacks.exclusive_ns)
            if (ns) out_ << path << " " << ns << "\n";
    }

private:
    OutputFormat format() const override { return OutputFormat::folded; }
};

// Prometheus' text exposition format (version 0.0.4): what `iprobe report
// --serve` answers on /metrics.
class PrometheusOutput final : public Output {
public:
    using Output::Output;
    void report(const ReportResult& r) override;

private:
    OutputFormat format() const override { return OutputFormat::prometheus; }
};

void TextOutput::status(const StatusResult& r) {
    const Status& st = r.status;
    out_ << "process " << st.pid << ": runtime " << (st.runtime_loaded ? "loaded (" + st.runtime_path + ")" : "not loaded")
         << "\n";
    if (!r.patches.empty()) {
        out_ << "  patched functions: " << r.patches.size() << "\n";
        for (const auto& f : r.patches) out_ << "    " << describe_patched(f) << "  [" << f.module << "]\n";
    }
    if (!st.region && st.forked_from && st.modules.empty()) {
        out_ << "no iprobe region of its own: forked from probed process " << st.forked_from
             << ", whose probe sites it no longer runs (" << st.fork_child_events
             << " events dropped before); the next attach probes it as itself\n";
        return;
    }
    if (!st.region && st.forked_from) {
        out_ << "no iprobe region of its own: forked from probed process " << st.forked_from << ", it still runs "
             << st.inherited_live << " of its parent's probes, whose " << st.fork_child_events
             << " events so far were dropped; 'iprobe detach " << st.pid << "' puts them back, 'iprobe attach " << st.pid
             << "' probes it as itself\n";
        for (const auto& m : st.modules) {
            out_ << "  " << m.path << ": ";
            if (m.live < 0) out_ << "live sites unknown\n";
            else out_ << m.live << " of " << m.probes << " sites live in the code\n";
        }
        if (!st.sites_unread.empty()) out_ << "  cannot read the live sites: " << st.sites_unread << "\n";
        return;
    }
    if (!st.region) {
        out_ << (st.runtime_loaded ? "no iprobe region: the runtime is loaded but inert (an attach was interrupted "
                                     "before it made one; the next attach uses it)\n"
                                   : "no iprobe region: never attached\n");
        return;
    }
    for (const auto& m : st.modules) {
        out_ << "  " << m.path << ": " << m.enabled << "/" << m.probes << " probes enabled, ";
        if (m.live < 0) out_ << "live sites unknown";
        else out_ << m.live << " sites live in the code";
        if (m.foreign) out_ << ", " << m.foreign << " sites hold other code";
        out_ << " (" << m.probes_path << ")\n";
        if (m.sites == "relocated")
            out_ << "    sites: relocated entries (a binary nobody prepared: first instructions moved to trampolines)\n";
        else if (m.sites == "pad+relocated")
            out_ << "    sites: pads (built with iprobe-cc, flow " << m.flow
                 << "), and relocated entries for the functions without one (small functions)\n";
        else if (!m.sites.empty())
            out_ << "    sites: pads (built with iprobe-cc, flow " << m.flow << ")\n";
    }
    if (!st.sites_unread.empty()) out_ << "  cannot read the live sites: " << st.sites_unread << "\n";
    out_ << "  threads: " << st.threads << " slots used of " << st.ring_count << "; region " << st.region_bytes
         << " bytes (sparse)\n";
    out_ << "  event rings: " << st.rings.size() << " in use (" << st.ring_records << " records each); dropped "
         << st.dropped << " (trace stream only, never in reports), no ring " << st.no_ring_events << "\n";
    for (const auto& ring : st.rings)
        out_ << "    tid " << ring.tid << " " << ring.state << ": " << ring.pending << " pending, " << ring.dropped
             << " dropped\n";
    if (st.unhooked_returns)
        out_ << "  unhooked returns: " << st.unhooked_returns << " (their exits are not seen): "
             << unhooked_why(st.unhooked_returns, st.unhooked_pool_empty) << "\n";
}

void TextOutput::report(const ReportResult& r) {
    char line[512];
    auto append = [&](int n) {
        out_.write(line, std::clamp(n, 0, static_cast<int>(sizeof line) - 1));
    };
    append(std::snprintf(line, sizeof line, "%-40s %12s %12s %14s %14s %10s %10s %10s %10s %7s\n", "function", "calls",
                         "completed", "incl total ns", "excl total ns", "mean ns", "p50 ns", "p99 ns", "max ns", "probed"));
    bool absent = false;
    for (const auto& f : r.functions) {
        // The name apart: a long demangled name is not cut (%-40s only pads).
        out_ << f.function;
        if (f.function.size() < 40) out_ << std::string(40 - f.function.size(), ' ');
        // A field the handler did not keep is '-', never 0.
        auto kept = [](bool has, std::uint64_t v) { return has ? std::to_string(v) : std::string("-"); };
        const bool times = f.has_times();
        absent = absent || !times;
        append(std::snprintf(line, sizeof line, " %12" PRIu64 " %12s %14s %14s %10s %10s %10s %10s %7s\n", f.calls,
                             kept(f.has_completed(), f.completed).c_str(), kept(times, f.inclusive_ns).c_str(),
                             kept(times, f.exclusive_ns).c_str(), kept(times, f.timed ? f.inclusive_ns / f.timed : 0).c_str(),
                             kept(times, f.p50_ns).c_str(), kept(times, f.p99_ns).c_str(), kept(times, f.max_ns).c_str(),
                             probed_percent(f, r.now_ns).c_str()));
    }
    if (absent)
        out_ << "-: not kept by the handler (count keeps calls; with --completed also completed calls; trace keeps "
                "times)\n";
    const bool conditioned =
        std::any_of(r.functions.begin(), r.functions.end(), [](const FunctionStats& f) { return f.conditioned; });
    if (conditioned) {
        out_ << "\nrecorded under --when/--min-duration (every call above is counted; its events only when matched):\n";
        append(std::snprintf(line, sizeof line, "%-40s %12s %12s %12s\n", "function", "calls", "matched", "undecided"));
        for (const auto& f : r.functions) {
            if (!f.conditioned) continue;
            out_ << f.function;
            if (f.function.size() < 40) out_ << std::string(40 - f.function.size(), ' ');
            append(std::snprintf(line, sizeof line, " %12" PRIu64 " %12" PRIu64 " %12" PRIu64 "\n", f.calls,
                                 f.raw.matched, f.raw.undecided));
        }
    }
    if (r.histograms)
        for (const auto& f : r.functions) out_ << "\n" << histogram_text(f);
    if (r.lost)
        append(std::snprintf(line, sizeof line, "lost: %" PRIu64 " calls (no thread slot free, or an unknown site)\n", r.lost));
    if (r.unhooked_returns)
        out_ << "unhooked: " << r.unhooked_returns << " calls whose exit could not be hooked, not in `completed`: "
             << unhooked_why(r.unhooked_returns, r.unhooked_pool_empty) << "\n";
    if (r.exits_lost_at_detach)
        append(std::snprintf(line, sizeof line,
                             "exits lost at detach: %" PRIu64 " calls were in flight when their exit hooks went off; not in "
                             "`completed`\n",
                             r.exits_lost_at_detach));
    for (const auto& module : r.never_loaded)
        out_ << "never loaded: " << module << " (the program did not load it: none of its functions probed)\n";
}

void JsonOutput::status(const StatusResult& r) {
    const Status& st = r.status;
    JsonWriter j;
    j.begin_object().field("pid", static_cast<std::int64_t>(st.pid)).field("runtime_loaded", st.runtime_loaded);
    j.field("runtime", st.runtime_path).field("region", st.region);
    if (st.forked_from)
        j.field("forked_from", static_cast<std::int64_t>(st.forked_from))
            .field("inherited_live", st.inherited_live)
            .field("fork_child_events", st.fork_child_events);
    j.key("modules").begin_array();
    for (const auto& m : st.modules)
        j.begin_object()
            .field("path", m.path)
            .field("probes_path", m.probes_path)
            .field("build_id", m.build_id)
            .field("probes", m.probes)
            .field("enabled", m.enabled)
            .field("live", m.live)
            .field("foreign", m.foreign)
            .field("sites", m.sites)
            .field("flow", m.flow)
            .end_object();
    j.end_array().key("rings").begin_array();
    for (const auto& ring : st.rings)
        j.begin_object()
            .field("tid", ring.tid)
            .field("state", ring.state)
            .field("pending", ring.pending)
            .field("dropped", ring.dropped)
            .end_object();
    j.end_array()
        .field("threads", st.threads)
        .field("region_bytes", st.region_bytes)
        .field("trace_dropped", st.dropped)
        .field("no_ring_events", st.no_ring_events)
        .field("no_slot_events", st.no_slot_events)
        .field("unknown_site_events", st.unknown_site_events)
        .field("unhooked_returns", st.unhooked_returns)
        .field("unhooked_pool_empty", st.unhooked_pool_empty)
        .field("sites_unread", st.sites_unread);
    j.key("patched").begin_array();
    for (const auto& f : r.patches) write_patched(j, f);
    j.end_array().end_object();
    out_ << j.str() << "\n";
}

void JsonOutput::report(const ReportResult& r) {
    JsonWriter j;
    j.begin_object().field("pid", static_cast<std::int64_t>(r.pids.empty() ? 0 : r.pids.front()));
    if (r.pids.size() > 1) {
        j.key("pids").begin_array();
        for (pid_t pid : r.pids) j.value(static_cast<std::int64_t>(pid));
        j.end_array();
    }
    j.key("functions").begin_array();
    for (const auto& f : r.functions) {
        j.begin_object();
        write_function_stats_fields(j, f);
        if (r.histograms) write_histogram_fields(j, f);
        j.end_object();
    }
    j.end_array()
        .field("unmatched_exits", r.unmatched_exits)
        .field("unhooked_returns", r.unhooked_returns)
        .field("unhooked_pool_empty", r.unhooked_pool_empty)
        .field("exits_lost_at_detach", r.exits_lost_at_detach)
        .field("lost", r.lost)
        .field("trace_dropped", r.trace_dropped);
    if (!r.never_loaded.empty()) j.field("never_loaded", r.never_loaded);
    j.end_object();
    out_ << j.str() << "\n";
}

// A label value: backslash, double quote and newline escaped.
std::string label_value(std::string_view text) {
    std::string out;
    for (char c : text) {
        if (c == '\\') out += "\\\\";
        else if (c == '"') out += "\\\"";
        else if (c == '\n') out += "\\n";
        else out += c;
    }
    return out;
}

// A sample value as Prometheus reads it (integers exactly).
std::string sample(std::uint64_t v) { return std::to_string(v); }
std::string seconds(std::uint64_t ns) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.9f", static_cast<double>(ns) / 1e9);
    return buf;
}

void PrometheusOutput::report(const ReportResult& r) {
    struct Family {
        const char* name;
        const char* type;
        const char* help;
    };
    auto head = [&](const Family& f) { out_ << "# HELP " << f.name << " " << f.help << "\n# TYPE " << f.name << " " << f.type << "\n"; };
    auto labels = [](const FunctionStats& f, std::string_view extra = {}) {
        std::string out = "{function=\"" + label_value(f.function) + "\"";
        if (f.kind == probelist::ProbeKind::point) out += ",kind=\"point\"";
        if (!extra.empty()) out += "," + std::string(extra);
        return out + "}";
    };
    const Family calls{"iprobe_function_calls_total", "counter", "Calls of the function (hits of a point probe) while probed."};
    head(calls);
    for (const auto& f : r.functions) out_ << calls.name << labels(f) << " " << sample(f.calls) << "\n";
    const Family completed{"iprobe_function_completed_total", "counter", "Calls of the function that returned while probed."};
    head(completed);
    // A field the handlers did not keep has no sample (absent, never 0).
    for (const auto& f : r.functions)
        if (f.has_completed()) out_ << completed.name << labels(f) << " " << sample(f.completed) << "\n";
    const Family duration{"iprobe_function_duration_seconds", "summary",
                          "Inclusive time of the function's timed calls: quantiles, sum and count."};
    head(duration);
    for (const auto& f : r.functions) {
        if (!f.has_times()) continue;
        out_ << duration.name << labels(f, "quantile=\"0.5\"") << " " << seconds(f.p50_ns) << "\n";
        out_ << duration.name << labels(f, "quantile=\"0.99\"") << " " << seconds(f.p99_ns) << "\n";
        out_ << duration.name << "_sum" << labels(f) << " " << seconds(f.inclusive_ns) << "\n";
        out_ << duration.name << "_count" << labels(f) << " " << sample(f.timed) << "\n";
    }
    const Family exclusive{"iprobe_function_exclusive_seconds_total", "counter",
                           "Time in the function itself, its probed callees' time taken out."};
    head(exclusive);
    for (const auto& f : r.functions)
        if (f.has_times()) out_ << exclusive.name << labels(f) << " " << seconds(f.exclusive_ns) << "\n";
    const Family max{"iprobe_function_max_seconds", "gauge", "The longest timed call of the function."};
    head(max);
    for (const auto& f : r.functions)
        if (f.has_times()) out_ << max.name << labels(f) << " " << seconds(f.max_ns) << "\n";
    // Under --when/--min-duration: the calls the condition held for, and
    // those it could not decide: counted, never silent.
    const bool conditioned =
        std::any_of(r.functions.begin(), r.functions.end(), [](const FunctionStats& f) { return f.conditioned; });
    if (conditioned) {
        const Family matched{"iprobe_function_matched_total", "counter",
                             "Calls a --when/--min-duration condition held for (their events recorded)."};
        head(matched);
        for (const auto& f : r.functions)
            if (f.conditioned) out_ << matched.name << labels(f) << " " << sample(f.raw.matched) << "\n";
        const Family undecided{"iprobe_function_undecided_total", "counter",
                               "Calls whose exit-time condition could not be evaluated (their entry had no frame)."};
        head(undecided);
        for (const auto& f : r.functions)
            if (f.conditioned) out_ << undecided.name << labels(f) << " " << sample(f.raw.undecided) << "\n";
    }
    const Family probed{"iprobe_function_probed_seconds", "gauge",
                        "How long the function's probes have been on since the first attach (its counts cover that)."};
    head(probed);
    for (const auto& f : r.functions) out_ << probed.name << labels(f) << " " << seconds(f.probed_ns(r.now_ns)) << "\n";
    const std::pair<Family, std::uint64_t> totals[] = {
        {{"iprobe_lost_events_total", "counter", "Calls not counted: no thread slot free, or an unknown site."}, r.lost},
        {{"iprobe_unhooked_returns_total", "counter", "Calls whose exit could not be hooked (not in completed)."},
         r.unhooked_returns},
        {{"iprobe_unhooked_returns_pool_empty_total", "counter",
          "Of the unhooked returns: the thread found the runtime's return pool held by other threads."},
         r.unhooked_pool_empty},
        {{"iprobe_unmatched_exits_total", "counter", "Exits whose entry came before the attach."}, r.unmatched_exits},
        {{"iprobe_exits_lost_at_detach_total", "counter",
          "Calls in flight when a detach turned their exit hooks off (not in completed)."},
         r.exits_lost_at_detach},
        {{"iprobe_trace_dropped_total", "counter", "Trace-stream events dropped on full rings (never in the sums)."},
         r.trace_dropped},
    };
    for (const auto& [family, value] : totals) {
        head(family);
        out_ << family.name << " " << sample(value) << "\n";
    }
    const Family processes{"iprobe_process_info", "gauge", "The processes this report reads, by PID."};
    head(processes);
    for (pid_t pid : r.pids) out_ << processes.name << "{pid=\"" << pid << "\"} 1\n";
}

}  // namespace

std::optional<OutputFormat> parse_output_format(std::string_view name) {
    for (std::size_t i = 0; i < std::size(kFormatNames); ++i)
        if (kFormatNames[i] == name) return static_cast<OutputFormat>(i);
    return std::nullopt;
}

std::string_view to_string(OutputFormat format) { return kFormatNames[static_cast<std::size_t>(format)]; }

bool writes(OutputFormat format, ResultKind kind) {
    switch (format) {
        case OutputFormat::text:
        case OutputFormat::json: return kind != ResultKind::folded;
        case OutputFormat::chrome: return kind == ResultKind::trace;
        case OutputFormat::folded: return kind == ResultKind::folded;
        case OutputFormat::prometheus: return kind == ResultKind::report;
    }
    return false;
}

void Output::unsupported(ResultKind kind) const {
    throw Error("--format " + std::string(to_string(format())) + " does not write " +
                    std::string(kResultNames[static_cast<std::size_t>(kind)]),
                ExitCode::usage);
}

void Output::attached(const AttachResult&) { unsupported(ResultKind::attach); }
void Output::detached(const DetachResult&) { unsupported(ResultKind::detach); }
void Output::status(const StatusResult&) { unsupported(ResultKind::status); }
void Output::report(const ReportResult&) { unsupported(ResultKind::report); }
void Output::reset(const ResetResult&) { unsupported(ResultKind::reset); }
void Output::folded(const FoldedStacks&) { unsupported(ResultKind::folded); }
void Output::trace_begin(pid_t) { unsupported(ResultKind::trace); }
void Output::trace(const TraceRecord&) { unsupported(ResultKind::trace); }
void Output::trace_end() { unsupported(ResultKind::trace); }

std::unique_ptr<Output> make_output(OutputFormat format, std::ostream& out) {
    switch (format) {
        case OutputFormat::text: return std::make_unique<TextOutput>(out);
        case OutputFormat::json: return std::make_unique<JsonOutput>(out);
        case OutputFormat::chrome: return std::make_unique<ChromeOutput>(out);
        case OutputFormat::folded: return std::make_unique<FoldedOutput>(out);
        case OutputFormat::prometheus: return std::make_unique<PrometheusOutput>(out);
    }
    throw Error("unknown output format", ExitCode::usage);
}

std::string trace_text_line(const TraceRecord& r) {
    char head[96];
    const int width = std::snprintf(head, sizeof head, "%" PRIu64 ".%09" PRIu64, static_cast<std::uint64_t>(r.time_ns / 1000000000ull),
                                    static_cast<std::uint64_t>(r.time_ns % 1000000000ull));
    // an exit recorded without its time (--no-durations): "-" where the time goes
    if (!r.stamped) std::snprintf(head, sizeof head, "%*s", width, "-");
    std::snprintf(head + std::strlen(head), sizeof head - std::strlen(head), " %7u ", r.tid);
    std::string line = head;
    // where the thread's ring dropped events (it was full): said on a line of its own
    if (r.dropped_before) line += "-- " + std::to_string(r.dropped_before) + " events dropped here (ring full) --\n" + head;
    // calls in flight whose exit hooks a detach turned off: closed here
    if (r.exits_lost_before)
        line += "-- " + std::to_string(r.exits_lost_before) + " calls in flight lost their exit at a detach --\n" + head;
    line.append(static_cast<std::size_t>(r.depth) * 2, ' ');
    line += r.kind == probelist::ProbeKind::entry ? "-> " : r.kind == probelist::ProbeKind::exit ? "<- " : "@ ";
    line += r.function;
    if (r.has_arguments) {  // "f(n=10)", at the entry and at its exit
        line += "(";
        for (std::size_t i = 0; i < r.arguments.size(); i++)
            line += (i ? ", " : "") + r.arguments[i].name + "=" + r.arguments[i].text;
        line += ")";
    }
    if (r.unwound) return line + "  unwound (no return value)\n";
    if (r.retval) line += " = " + r.retval->text;
    if (r.kind == probelist::ProbeKind::point)
        for (std::size_t i = 0; i < r.args.size(); i++)
            line += (i ? ", " : " (") + std::to_string(r.args[i]) + (i + 1 == r.args.size() ? ")" : "");
    if (r.in_signal) line += "  [in signal handler]";
    line += "\n";
    for (const Frame& f : r.backtrace) {
        line += std::string(28 + 2 * static_cast<std::size_t>(r.depth), ' ') + "   from " +
                (f.function.empty() ? hex(f.address) : f.function);
        if (!f.file.empty()) line += " (" + f.file + ":" + std::to_string(f.line) + ")";
        line += "\n";
    }
    return line;
}

void sort_report(std::vector<FunctionStats>& rows) {
    std::sort(rows.begin(), rows.end(), [](const FunctionStats& a, const FunctionStats& b) {
        return a.inclusive_ns != b.inclusive_ns ? a.inclusive_ns > b.inclusive_ns
               : a.calls != b.calls             ? a.calls > b.calls
                                                : a.function < b.function;
    });
}

std::string describe_patched(const PatchedFunction& f) {
    return f.function + " -> " + (f.library.empty() ? "(unmapped)" : f.library) + ":" +
           (f.symbol.empty() ? hex(f.replacement) : f.symbol) + (f.stub ? " (through a stub)" : "");
}

void write_patched(JsonWriter& j, const PatchedFunction& f) {
    j.begin_object()
        .field("function", f.function)
        .field("module", f.module)
        .field("entry", hex(f.entry))
        .field("library", f.library)
        .field("symbol", f.symbol)
        .field("replacement", hex(f.replacement))
        .field("via_stub", f.stub != 0);
    if (!f.signature_check.empty()) j.field("signature_check", f.signature_check).field("signature", f.signature);
    j.end_object();
}

}  // namespace iprobe::hotpatch
