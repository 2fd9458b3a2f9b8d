// iprobe-hotpatch: `iprobe attach|detach|status|trace|report` (argv[1] is
// the subcommand, set by the iprobe dispatcher).
#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cctype>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "iprobe/hotpatch/agent.h"
#include "iprobe/hotpatch/agent_protocol.h"
#include "iprobe/hotpatch/attach_report.h"
#include "iprobe/hotpatch/condition.h"
#include "iprobe/hotpatch/output.h"
#include "iprobe/hotpatch/hotpatch.h"
#include "iprobe/hotpatch/run.h"
#include "iprobe/support/args.h"
#include "iprobe/support/error.h"
#include "iprobe/support/file.h"
#include "iprobe/support/glob.h"
#include "iprobe/support/http_server.h"
#include "patch_cmd.h"
#include "iprobe/support/json.h"
#include "iprobe/hotpatch/trace_file.h"
#include "iprobe/support/number.h"
#include "iprobe/hotpatch/trace_reader.h"

using namespace iprobe;
using namespace iprobe::hotpatch;

namespace {

volatile sig_atomic_t g_stop = 0;
std::string g_command = "attach";

constexpr const char* kSynopsis =
    "usage: iprobe attach PID [--probes LIST[,LIST…]] [--module NAME[,NAME…]] [--functions GLOB,…] [--files GLOB,…]\n"
    "                     [--entry-only|--exit-only] [--handler trace [--no-durations]|count [--completed]] [--buffer SIZE] [--json]\n"
    "                     [--max-threads N] [--args] [--retval] [--backtrace[=DEPTH]] [--when EXPR] [--min-duration TIME]\n"
    "       iprobe detach PID [--functions GLOB,…] [--entry-only|--exit-only] [--json]\n"
    "       iprobe status PID [--json]   (also lists functions replaced by 'iprobe patch')\n"
    "       iprobe trace  PID [--duration S] [--lossless] [--format text|json|chrome] [--output FILE]\n"
    "       iprobe trace  --input FILE [--format text|json|chrome]\n"
    "       iprobe report PID[,PID…] [--json] [--since-last|--reset] [--duration S] [--at-exit]\n"
    "       iprobe report PID --folded [--duration S]\n"
    "       iprobe report PID --hist [--json] [--since-last|--duration S]\n"
    "       iprobe report PID[,PID…] --format prometheus | --serve HOST:PORT\n"
    "       iprobe run [--exec] [--report FILE] [--json] [--module NAME[,NAME…]] [attach's options] -- PROGRAM [ARGS…]\n"
    "       iprobe agent PID [--probes LIST[,LIST…]] [--handler trace|count [--completed]] [--buffer SIZE]";

constexpr const char* kAbout =
    "attach  turns the placeholder NOPs of a running, coldpatched process into calls to\n"
    "        the iprobe runtime (injected with dlopen if the process was not started\n"
    "        with it). LIST is a probe list, a coldpatched binary or shared library\n"
    "        (default: the process's executable). Attaching again adds probes.\n"
    "        A binary nobody prepared (no iprobe-cc: no list, no pads) is probed all\n"
    "        the same: one entry and exit probe per function symbol whose first\n"
    "        instructions can move to a trampoline ('iprobe list FILE --refused' says\n"
    "        which cannot, and why). --module NAME picks a library the process has\n"
    "        loaded by its file name (libz.so.1, or libz).\n"
    "        Every handler keeps exact per-function sums in each thread's own slot\n"
    "        of the process's region. --handler trace (default) also times calls\n"
    "        (inclusive/exclusive, latency histogram) and logs entry/exit events to a\n"
    "        per-thread ring for 'iprobe trace'; count only counts calls, from the\n"
    "        entries alone (exits untouched, so it costs what a compiled-in counter\n"
    "        costs); --completed (or --exit-only) turns the exits on to count\n"
    "        completed calls too.\n"
    "        --buffer SIZE (bytes, K/M/G suffix; default 512K) sets each thread's\n"
    "        event ring when the first attach creates the region.\n"
    "        --when EXPR records a function's events only for calls EXPR holds for,\n"
    "        checked in the target; every call is still counted ('report' shows\n"
    "        calls and matched). EXPR: parameter names (DWARF) or arg0..arg5, retval,\n"
    "        duration (2ms, 500us, 10ns, 1s), integers, \"strings\" (== or != a\n"
    "        char* parameter), == != < <= > >=, && || ! and parentheses, e.g.\n"
    "        'n == 10', 'len > 4096 && retval < 0', 'key == \"user:42\"'. A name\n"
    "        a selected function lacks is refused (exit 3). Attaching again with\n"
    "        another --when (or none) changes it on the running process.\n"
    "        --min-duration TIME records only calls at least TIME long\n"
    "        (duration >= TIME, with --when: both). --retval keeps a log2\n"
    "        histogram of each function's integer return value (report --hist).\n"
    "detach  puts the NOPs back (all probes, or those matching --functions and the kind).\n"
    "status  shows the runtime, modules, enabled probes, threads and event drops.\n"
    "trace   streams events live, symbolized (Ctrl-C or --duration ends it);\n"
    "        chrome writes Chrome trace-event JSON that Perfetto opens. --output\n"
    "        writes a compact binary file instead (8 bytes an event; one with\n"
    "        --args/--retval keeps its values too, typed), which --input FILE\n"
    "        converts to any --format later, as\n"
    "        live; with --format too, both at once. --lossless: every event,\n"
    "        the traced threads waiting for the reader when their ring is full\n"
    "        (the default drops and counts, never slowing the target).\n"
    "report  prints calls, completed calls, inclusive/exclusive time and p50/p99/max\n"
    "        latency per function since the first attach: exact at any event rate,\n"
    "        changes nothing (two reports agree), still answers after detach.\n"
    "        --duration S: only what happened during the next S seconds.\n"
    "        --since-last: only what happened since the last --since-last or --reset.\n"
    "        --reset: mark now as the start for the next --since-last.\n"
    "        --at-exit: wait until the process exits, then report its totals.\n"
    "        --hist: each function's log2 latency histogram (its buckets add up to\n"
    "        its timed calls), and of its return value after attach --retval.\n"
    "        --folded: folded stacks (exclusive ns) for flamegraph.pl, from the event\n"
    "        stream (consumes it, like trace).\n"
    "        'probed' is the share of the time since the first attach that the\n"
    "        function's probes were on: its counts cover only that part (probes\n"
    "        detached, or dropped by `iprobe debug --adapt`, count nothing); JSON\n"
    "        gives it as instants: live_ns (finished stretches), live_since_ns (on\n"
    "        since, 0 when off) and window_start_ns (the first attach).\n"
    "        --format prometheus: the same sums in Prometheus' text exposition format;\n"
    "        --serve HOST:PORT answers GET /metrics with them (read afresh per scrape).\n"
    "        Several PIDs (PID,PID,...): their rows merged by function, e.g. the\n"
    "        clones of `iprobe debug --clones N`, each probing its share.\n"
    "run     starts PROGRAM with the runtime preloaded, held before any of its\n"
    "        code runs (constructors included) until the probes are on; when it\n"
    "        exits, its whole run's report (as report --at-exit) and its exit\n"
    "        status. --module NAME (or --probes of a library) that PROGRAM loads\n"
    "        later (dlopen: java's libjvm.so, Python's extension modules,\n"
    "        plugins) is probed as it loads, before its constructors run and\n"
    "        before dlopen returns, as gdb's pending breakpoints; one never\n"
    "        loaded is said at exit (report: never loaded). Exit status: the\n"
    "        program's, or if nothing at all could be probed 5 (or the failed\n"
    "        attach's code). --exec: PROGRAM takes iprobe's place (same PID and\n"
    "        parent), the report is written after it exits (--report FILE, %p\n"
    "        its PID).";

constexpr const char* kFooter =
    "exit codes: 0 ok, 1 failed, 2 usage, 3 bad input, 4 permission, 5 not found, 6 busy, 7 unavailable,\n"
    "            130 interrupted (SIGINT/SIGTERM; an attach or detach in progress is undone first)";

// The synopsis lines of one command (all of them for the overview): its
// usage errors show its own line, not attach's.
std::string synopsis_of(const std::string& command) {
    std::string out;
    std::size_t from = 0;
    const std::string text = kSynopsis;
    bool keep = false;  // a continuation line goes with its command's
    while (from < text.size()) {
        const std::size_t end = std::min(text.find('\n', from), text.size());
        std::string line = text.substr(from, end - from);
        from = end + 1;
        if (line.find("iprobe ") == std::string::npos) {
            if (keep) out += "\n" + line;
            continue;
        }
        line.erase(0, line.find("iprobe "));
        const std::string name = line.substr(7, line.find(' ', 7) - 7);
        keep = command.find('|') == std::string::npos ? name == command : command.find(name) != std::string::npos;
        if (keep) out += (out.empty() ? "usage: " : "\n       ") + line;
    }
    return out;
}

ArgSpec spec_of(const std::string& command) {
    ArgSpec spec("iprobe " + command, synopsis_of(command), kAbout,
    {
        {"--probes", "LIST", "probe list(s), coldpatched binaries or libraries, comma-separated\n(default: the process's executable)"},
        {"--module", "NAME,...", "attach: the probes of a loaded library (or the executable) by file name,\ne.g. libz.so.1 or libz; run: also of one the program loads later (dlopen)"},
        {"--functions", "GLOB,...", "only probes of functions matching a GLOB (demangled or raw)"},
        {"--files", "GLOB,...", "only probes in source files matching a GLOB"},
        {"--entry-only", "", "only entry probes"},
        {"--exit-only", "", "only exit probes"},
        {"--handler", "trace|count", "attach: what enabled probes do (default trace)"},
        {"--completed", "", "attach, run: with --handler count, also count completed calls (turns the exits\non: every return then goes through a return trampoline)"},
        {"--no-durations", "", "attach, run: with --handler trace, one clock read a call, at its entry: exits are\nrecorded in order but without a time (no durations: report keeps calls and completed; trace\nprints such an exit's time as '-'); for the calls' order, nesting and start times at less cost"},
        {"--args", "", "attach: record each call's arguments (typed from DWARF; else arg0..arg5 raw, except in the -finstrument-functions flow, which needs DWARF)"},
        {"--retval", "", "attach: record each call's return value (and keep its log2 histogram: report --hist)"},
        {"--backtrace", "DEPTH", "attach: record the callers of each call, at most DEPTH (1-32, default 8)", {}, true},
        {"--buffer", "SIZE", "attach: each thread's event ring (K/M/G suffix; default 512K)"},
        {"--ring-records", "N", "attach: each thread's event ring in records (instead of --buffer)"},
        {"--max-threads", "N", "attach, run: thread slots, each a thread's sums and ring (default 512; threads\nbeyond them at once are counted in `lost`); like --buffer, set by a process's first attach"},
        {"--runtime", "PATH", "attach: the runtime library to inject (default: the installed one)"},
        {"--duration", "S", "trace, report: stop after S seconds"},
        {"--format", "FORMAT", "text (default), json; trace: chrome; report: folded, prometheus"},
        {"--serve", "ADDR", "report: answer Prometheus' scrapes of http://ADDR/metrics until Ctrl-C\n(HOST:PORT; port 0 picks one, said on stderr)"},
        {"--output", "FILE", "trace: write the compact binary event file instead (with --format: as well)"},
        {"--lossless", "", "trace: every event: a thread whose ring is full waits for the reader instead\nof dropping (slows the target down to the reader's pace; default: lossy, drops counted)"},
        {"--input", "FILE", "trace: convert a file written by --output (no PID)"},
        {"--since-last", "", "report: only what happened since the last --since-last or --reset"},
        {"--reset", "", "report: mark now as the start for the next --since-last"},
        {"--at-exit", "", "report: wait until the process exits, then report its totals"},
        {"--folded", "", "report: folded stacks for flamegraph.pl (consumes the event stream)"},
        {"--hist", "", "report: per function, the log2 latency (and --retval value) histogram"},
        {"--when", "EXPR", "attach: record only calls EXPR holds for (e.g. 'n == 10', 'duration > 2ms')"},
        {"--min-duration", "TIME", "attach: record only calls at least TIME long (2ms, 500us, 10ns, 1s)"},
        {"--exec", "", "run: PROGRAM replaces iprobe (same PID); the report is written after it exits"},
        {"--report", "FILE", "run: write the report to FILE (%p: the program's PID) instead of stderr"},
        {"--json", "", "machine-readable output"},
    },
                   kFooter);
    if (command == "run") spec.command_after_dashes();
    return spec;
}

[[noreturn]] void usage_error(const std::string& message) {
    throw Error(message + "\n(see 'iprobe " + g_command + " --help')", ExitCode::usage);
}

struct Args {
    std::string command;
    pid_t pid = 0;
    std::vector<pid_t> more_pids;  // report: merged with pid
    std::map<std::string, std::string> values;
    std::vector<std::string> probes;
    std::vector<std::string> modules;  // attach --module
    std::vector<std::string> program;  // run: what follows --
    bool flag(const std::string& name) const { return values.count(name) != 0; }
    std::string value(const std::string& name, const std::string& fallback = {}) const {
        auto it = values.find(name);
        return it == values.end() ? fallback : it->second;
    }
};

Args parse(int argc, char** argv) {
    Args args;
    args.command = argv[1];
    const ArgSpec spec = spec_of(args.command);
    const ParsedArgs parsed = spec.parse(argc, argv, 2);
    if (parsed.help_requested()) {
        std::cout << spec.help();
        std::exit(0);
    }
    for (const auto& list : parsed.values("--probes"))
        for (auto& p : split_list(list)) args.probes.push_back(p);
    for (const auto& list : parsed.values("--module"))
        for (auto& m : split_list(list)) args.modules.push_back(m);
    for (const char* name : {"--args", "--retval", "--backtrace", "--functions", "--files",
                             "--entry-only", "--exit-only", "--handler", "--completed", "--no-durations", "--buffer", "--ring-records",
                             "--max-threads", "--runtime", "--duration", "--format", "--output", "--input", "--lossless", "--since-last",
                             "--reset", "--at-exit", "--folded", "--json", "--exec", "--report", "--hist", "--when",
                             "--min-duration", "--serve"})
        if (parsed.has(name)) args.values[name] = parsed.value(name);
    if (args.command == "run") {
        if (!parsed.positionals().empty()) usage_error("unexpected argument " + parsed.positionals().front() + " (the program follows --)");
        args.program = parsed.command();
        if (args.program.empty()) usage_error("missing the program: iprobe run [OPTIONS] -- PROGRAM [ARGS]");
        return args;
    }
    for (const char* name : {"--exec", "--report"})
        if (args.flag(name)) usage_error(std::string(name) + " is an option of 'iprobe run'");
    if (parsed.positionals().size() > 1) usage_error("unexpected argument " + parsed.positionals()[1]);
    if (!parsed.positionals().empty()) {
        const auto pids = split_list(parsed.positionals().front());
        if (pids.empty()) usage_error("missing PID");
        if (pids.size() > 1 && args.command != "report") usage_error("one PID only ('" + parsed.positionals().front() + "')");
        args.pid = parse_pid_or_usage(pids.front());
        for (std::size_t i = 1; i < pids.size(); ++i) args.more_pids.push_back(parse_pid_or_usage(pids[i]));
    }
    if (args.pid == 0 && !(args.command == "trace" && args.flag("--input"))) usage_error("missing PID");
    if (args.pid != 0 && args.flag("--input")) usage_error("--input reads a file: give no PID");
    return args;
}

probelist::ProbeSelector selector_of(const Args& args) {
    probelist::ProbeSelector s;
    s.function_globs = split_list(args.value("--functions"));
    s.file_globs = split_list(args.value("--files"));
    if (args.flag("--entry-only") && args.flag("--exit-only")) usage_error("--entry-only and --exit-only exclude each other");
    if (args.flag("--entry-only")) s.kinds = {probelist::ProbeKind::entry};
    if (args.flag("--exit-only")) s.kinds = {probelist::ProbeKind::exit};
    return s;
}

// Records per thread ring for a --buffer size: the largest power of two
// that fits, at least 64 records.
std::uint32_t ring_records_for(const std::string& text) {
    char* end = nullptr;
    errno = 0;
    const unsigned long long n = std::strtoull(text.c_str(), &end, 10);
    if (text.empty() || !std::isdigit(static_cast<unsigned char>(text[0])) || errno || end == text.c_str())
        usage_error("--buffer must be a size such as 512K, 4M or 1G, not '" + text + "'");
    const std::string unit(end);
    const unsigned long long scale = unit.empty() || unit == "B"   ? 1ull
                                     : unit == "K" || unit == "KiB" ? 1ull << 10
                                     : unit == "M" || unit == "MiB" ? 1ull << 20
                                     : unit == "G" || unit == "GiB" ? 1ull << 30
                                                                    : 0;
    if (!scale) usage_error("--buffer must be a size such as 512K, 4M or 1G, not '" + text + "'");
    if (n > (1ull << 34) / scale) usage_error("--buffer " + text + " is too large (at most 16G per thread)");
    const unsigned long long records = n * scale / sizeof(iprobe_rt_record);
    if (records < 64) usage_error("--buffer " + text + " is too small (at least 2K per thread)");
    std::uint32_t out = 64;
    while (out < (1u << 29) && 2ull * out <= records) out *= 2;
    return out;
}

// attach's and run's options: which probes, what they do.
AttachOptions attach_options_of(const Args& args) {
    AttachOptions o;
    o.pid = args.pid;
    o.probe_sources = args.probes;
    o.modules = args.modules;
    o.selector = selector_of(args);
    const std::string handler = args.value("--handler", "trace");
    if (handler == "trace") o.mode = HandlerMode::trace;
    else if (handler == "count") o.mode = HandlerMode::count;
    else usage_error("--handler must be trace or count");
    if (args.flag("--completed") && o.mode != HandlerMode::count)
        usage_error("--completed is for --handler count (trace keeps completed calls and times anyway)");
    o.count_exits = args.flag("--completed");
    if (args.flag("--no-durations") && o.mode != HandlerMode::trace)
        usage_error("--no-durations is for --handler trace (the count handler reads no clock)");
    o.exit_times = !args.flag("--no-durations");
    if (args.flag("--ring-records") && args.flag("--buffer")) usage_error("--ring-records and --buffer exclude each other");
    if (args.flag("--ring-records"))
        o.ring_records = static_cast<std::uint32_t>(parse_unsigned_or_usage(args.value("--ring-records"), "--ring-records", 1, 1u << 30));
    if (args.flag("--buffer")) o.ring_records = ring_records_for(args.value("--buffer"));
    if (args.flag("--max-threads"))
        o.max_threads = static_cast<std::uint32_t>(
            parse_unsigned_or_usage(args.value("--max-threads"), "--max-threads", 1, kMaxThreadSlots));
    o.geometry_given = args.flag("--buffer") || args.flag("--ring-records") || args.flag("--max-threads");
    o.runtime_library = args.value("--runtime");
    o.when = args.value("--when");
    o.min_duration = args.value("--min-duration");
    if (args.flag("--when") && o.when.empty()) usage_error("--when needs an expression, e.g. --when 'n == 10'");
    // Syntax first, before the target is looked at (exit 3 with a caret).
    if (!o.when.empty()) (void)hotpatch::Condition::parse(o.when);
    if (!o.min_duration.empty()) (void)hotpatch::Condition::min_duration(o.min_duration);
    o.values = value_options_of(args.flag("--args"), args.flag("--retval"), args.flag("--backtrace"),
                                args.value("--backtrace"));
    if (o.values.any() && o.mode != HandlerMode::trace) usage_error("--args, --retval and --backtrace need --handler trace");
    o.retval_histogram = o.values.retval;  // the value is captured and its histogram kept
    if ((!o.when.empty() || !o.min_duration.empty()) && o.mode != HandlerMode::trace)
        usage_error("--when and --min-duration need --handler trace");
    return o;
}

// The writer of --format (--json, --folded: its short forms), checked for
// the command's result before the command acts.
std::unique_ptr<Output> output_of(const Args& args, ResultKind kind) {
    const int given = args.flag("--format") + args.flag("--json") + args.flag("--folded");
    if (given > 1) usage_error("--format, --json and --folded exclude each other");
    OutputFormat format = OutputFormat::text;
    if (args.flag("--json")) format = OutputFormat::json;
    if (args.flag("--folded")) format = OutputFormat::folded;
    if (args.flag("--format")) {
        const auto named = parse_output_format(args.value("--format"));
        if (!named) usage_error("--format must be text, json, chrome, folded or prometheus, not '" + args.value("--format") + "'");
        format = *named;
    }
    if (!writes(format, kind))
        usage_error("'iprobe " + args.command + "' cannot write --format " + std::string(to_string(format)));
    return make_output(format, std::cout);
}

int cmd_attach(const Args& args) {
    const auto out = output_of(args, ResultKind::attach);
    out->attached({args.pid, attach(attach_options_of(args))});
    return 0;
}

int cmd_detach(const Args& args) {
    const auto out = output_of(args, ResultKind::detach);
    DetachOptions o;
    o.pid = args.pid;
    o.selector = selector_of(args);
    const DetachStats st = detach(o);
    out->detached({args.pid, st});
    if (!st.region_problem.empty())
        std::cerr << "iprobe detach: the region was not used (" << st.region_problem
                  << "); the code was restored from the probe lists and the binaries, the region's flags left as they were\n";
    if (st.not_restored) {
        std::cerr << "iprobe detach: " << st.not_restored << " of the selected sites still hold a live call after detach; "
                  << "see 'iprobe status " << args.pid << "'\n";
        return static_cast<int>(ExitCode::failure);
    }
    return 0;
}

int cmd_status(const Args& args) {
    const auto out = output_of(args, ResultKind::status);
    out->status({status(args.pid), patched_functions(args.pid)});
    return 0;
}

// No --duration: until Ctrl-C (trace) or a single drain (report); 0: one drain.
double parse_duration(const Args& args) {
    if (!args.flag("--duration")) return -1;
    return parse_decimal_or_usage(args.value("--duration"), "--duration (seconds)", 0, 1e9);
}

bool alive(pid_t pid) { return ::kill(pid, 0) == 0 || errno == EPERM; }

// Drains until the duration ends, Ctrl-C, or the process exits.
void collect(TraceReader& reader, double seconds, const std::function<std::size_t()>& drain, bool until_stop) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(std::max(seconds, 0.0));
    drain();
    if (seconds == 0 || (seconds < 0 && !until_stop)) return;
    while (!g_stop && alive(reader.pid()) && (seconds < 0 || std::chrono::steady_clock::now() < end)) {
        const auto pause = reader.pause_after(drain());
        if (pause.count() > 0) std::this_thread::sleep_for(pause);
    }
    drain();
}

void collect(TraceReader& reader, double seconds, const std::function<void(const Event&)>& sink, bool until_stop) {
    collect(reader, seconds, [&] { return reader.drain(sink); }, until_stop);
}

// Calls a detach left without their exits whose threads made no event
// after it: the stream could not say it where it happened.
void say_exit_marks_waiting(std::uint64_t calls) {
    if (calls)
        std::cerr << "iprobe: " << calls
                  << " calls in flight lost their exit at a detach, their threads with no event after it: "
                     "shown open (report: exits_lost_at_detach)\n";
}

int cmd_trace(const Args& args) {
    const auto out = output_of(args, ResultKind::trace);
    CallNesting nesting;
    if (args.flag("--input")) {
        if (args.flag("--duration")) usage_error("--duration is for a live trace, not --input");
        if (args.flag("--output")) usage_error("--input converts a file; --output writes one from a live process");
        TraceFileReader file(args.value("--input"));
        const ProbeInfo unknown{"?", "?", "", 0, probelist::ProbeKind::entry, ""};
        out->trace_begin(file.pid());
        const auto& probes = file.probes();
        // A chunk at a time: Ctrl-C (or a closed pipe) ends it between two.
        while (!g_stop && file.next([&](const Event& e) {
            nesting.records(e, e.probe < probes.size() ? probes[e.probe] : unknown,
                            [&](const TraceRecord& r) { out->trace(r); });
        })) {
        }
        out->trace_end();
        say_exit_marks_waiting(file.exit_marks_waiting());
        return g_stop ? static_cast<int>(ExitCode::interrupted) : 0;
    }
    const double seconds = parse_duration(args);
    TraceReader reader(args.pid);
    if (args.flag("--lossless")) reader.set_lossless(true);
    const auto print = [&](const Event& e) {
        nesting.records(e, reader.probe(e.probe), [&](const TraceRecord& r) { out->trace(r); });
    };
    if (args.flag("--output")) {
        // With --format too, the events are printed as they are written (what
        // --input FILE --format prints of the file later).
        const bool shown = args.flag("--format") || args.flag("--json");
        TraceFileWriter writer(args.value("--output"), args.pid, reader.wall_clock(), &reader.value_types());
        if (shown) out->trace_begin(args.pid);
        // Raw runs of records, encoded in bulk: the writer keeps up with the threads.
        collect(reader, seconds,
                [&] {
                    const std::size_t records = reader.drain_runs(
                        [&](const RecordRun& run) {
                            writer.write(run);
                            if (shown) reader.decode(run, print);
                        },
                        [&](const ExitMark& mark) { writer.mark(mark); });
                    if (shown) reader.decode_end(print);
                    return records;
                },
                true);
        writer.finish(reader.probes());
        if (shown) out->trace_end();
        if (shown) say_exit_marks_waiting(reader.exit_marks_waiting());
        std::cerr << "iprobe: " << writer.events() << " events written to " << args.value("--output") << " ("
                  << writer.bytes() << " bytes";
        std::cerr << std::fixed << std::setprecision(1);
        if (writer.events())
            std::cerr << ", " << static_cast<double>(writer.bytes()) / static_cast<double>(writer.events()) << " bytes/event";
        if (writer.values_events())
            std::cerr << "; " << writer.values_events() << " with values, "
                      << static_cast<double>(writer.values_bytes()) / static_cast<double>(writer.values_events())
                      << " bytes each";
        std::cerr << ")\n";
    } else {
        out->trace_begin(args.pid);
        collect(reader, seconds, print, true);
        out->trace_end();
        say_exit_marks_waiting(reader.exit_marks_waiting());
    }
    if (args.flag("--lossless")) {
        if (const std::uint64_t gave_up = reader.lossless_timeouts())
            std::cerr << "iprobe: lossless: " << gave_up << " waits for this reader gave up after "
                      << IPROBE_RT_LOSSLESS_WAIT_S << " s (the trace went lossy then)\n";
        reader.set_lossless(false);
    }
    if (const std::uint64_t dropped = reader.take_dropped()) {
        std::cerr << "iprobe: " << dropped << " events dropped (ring full; report's sums are unaffected):";
        for (const auto& d : reader.drops_by_thread()) std::cerr << " tid " << d.tid << ": " << d.dropped;
        std::cerr << " (since attach)\n";
    }
    return 0;
}

struct Frame {
    std::string function;
    std::uint64_t tsc = 0;
    std::uint64_t children = 0;  // ticks
};

// Folded stacks from the event stream (it has the call paths; the sums do not).
int report_folded(const Args& args, Output& out) {
    if (args.flag("--since-last") || args.flag("--reset") || args.flag("--at-exit") || args.flag("--serve"))
        usage_error("--folded reads the event stream; it takes only --duration");
    const double seconds = parse_duration(args);
    TraceReader reader(args.pid, TraceReader::Access::stream);
    const double ns_per_tick = 1e9 / reader.tsc_hz();
    FoldedStacks result;
    std::map<std::string, std::uint64_t>& folded = result.exclusive_ns;
    std::unordered_map<std::uint32_t, std::vector<Frame>> stacks;
    // The events come from rings the target can write: threads, stack depth
    // and distinct paths are bounded (deeper frames are not folded in).
    constexpr std::size_t kMaxThreads = 1u << 14, kMaxDepth = 512, kMaxPathBytes = 64u << 20;
    std::size_t path_bytes = 0;
    auto sink = [&](const Event& e) {
        const ProbeInfo& info = reader.probe(e.probe);
        if (stacks.size() >= kMaxThreads && !stacks.count(e.tid)) return;
        auto& stack = stacks[e.tid];
        // calls a detach left without their exits: nothing to fold, and no caller of what follows
        for (const LostExits& lost : e.exits_lost_before) {
            std::uint64_t left = lost.count;
            for (std::size_t i = stack.size(); i-- > 0 && left > 0;)
                if (lost.function.empty() || stack[i].function == lost.function) {
                    stack.erase(stack.begin() + static_cast<std::ptrdiff_t>(i));
                    left--;
                }
        }
        if (e.kind == probelist::ProbeKind::entry) {
            // an entry whose exit is not traced has no time to fold
            if (e.exit_traced && stack.size() < kMaxDepth) stack.push_back({info.function, e.tsc, 0});
        } else if (e.kind == probelist::ProbeKind::exit) {
            // Unwind to the matching frame (events may have been dropped).
            auto it = std::find_if(stack.rbegin(), stack.rend(), [&](const Frame& f) { return f.function == info.function; });
            if (it == stack.rend()) return;
            stack.erase(it.base(), stack.end());
            Frame frame = stack.back();
            stack.pop_back();
            if (!e.stamped) {  // --no-durations: no duration to fold, none to give its caller
                result.unstamped_calls++;
                return;
            }
            const std::uint64_t ticks = e.tsc > frame.tsc ? e.tsc - frame.tsc : 0;
            const std::uint64_t self = ticks > frame.children ? ticks - frame.children : 0;
            if (!stack.empty()) stack.back().children += ticks;
            std::string path;
            for (const auto& f : stack) path += f.function + ";";
            path += info.function;
            auto at = folded.find(path);
            if (at == folded.end()) {
                if (path_bytes + path.size() > kMaxPathBytes) return;
                path_bytes += path.size();
                at = folded.emplace(path, 0).first;
            }
            at->second += static_cast<std::uint64_t>(static_cast<double>(self) * ns_per_tick);
        }
    };
    collect(reader, seconds, sink, false);
    if (result.unstamped_calls)
        std::fprintf(stderr,
                     "iprobe report: %" PRIu64 " calls left out: their exits have no time (attached with --no-durations)\n",
                     result.unstamped_calls);
    out.folded(result);
    return 0;
}

// Blocks until `pid` exits (or Ctrl-C); the region stays readable meanwhile.
void wait_for_exit(pid_t pid) {
    const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
    if (pidfd < 0) return;
    pollfd p{pidfd, POLLIN, 0};
    while (!g_stop && ::poll(&p, 1, 200) == 0) {
    }
    ::close(pidfd);
}

std::uint64_t realtime_ns() {
    timespec ts{};
    ::clock_gettime(CLOCK_REALTIME, &ts);
    return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

// What `iprobe report` writes (and `iprobe run` when the program exits):
// the rows of one or several processes, merged by function.
ReportResult report_of(std::vector<std::vector<FunctionStats>> per_process, const std::vector<const TraceReader*>& readers,
                       const std::vector<pid_t>& pids) {
    ReportResult r;
    r.pids = pids;
    r.functions = per_process.size() == 1 ? std::move(per_process.front()) : merge_functions(per_process);
    sort_report(r.functions);
    for (const auto& reader : readers) {
        r.unmatched_exits += reader->unmatched_exits();
        r.unhooked_returns += reader->unhooked_returns();
        r.unhooked_pool_empty += reader->unhooked_pool_empty();
        r.exits_lost_at_detach += reader->exits_lost_at_detach();
        r.lost += reader->lost_events();
        r.trace_dropped += reader->dropped();
    }
    r.now_ns = realtime_ns();
    return r;
}

// --serve ADDR: Prometheus scrapes /metrics; each scrape reads the sums
// afresh.  One connection at a time, until Ctrl-C.
int serve_report(const Args& args, const std::vector<std::unique_ptr<TraceReader>>& readers, const std::vector<pid_t>& pids) {
    if (args.flag("--duration") || args.flag("--since-last") || args.flag("--reset") || args.flag("--at-exit"))
        usage_error("--serve answers every scrape with the totals; it takes none of --duration, --since-last, --reset, --at-exit");
    const auto format = args.flag("--format") ? parse_output_format(args.value("--format")) : OutputFormat::prometheus;
    if (format != OutputFormat::prometheus && format != OutputFormat::json)
        usage_error("--serve writes --format prometheus (default) or json");
    HttpEndpoint endpoint(args.value("--serve"));
    std::cerr << "iprobe report: serving " << (format == OutputFormat::json ? "the report as JSON" : "Prometheus metrics")
              << " of process " << pids.front() << (pids.size() > 1 ? " and the others" : "") << " at http://"
              << endpoint.address() << "/metrics (Ctrl-C ends it)\n";
    std::vector<const TraceReader*> read;
    for (const auto& r : readers) read.push_back(r.get());
    while (!g_stop) {
        endpoint.serve_one(std::chrono::milliseconds(200), [&](std::string_view path) -> HttpResponse {
            if (path != "/metrics") return {404, "text/plain; charset=utf-8", "not found: ask /metrics\n"};
            std::vector<std::vector<FunctionStats>> per_process;
            for (const auto& reader : readers) per_process.push_back(reader->functions(reader->sums()));
            std::ostringstream body;
            make_output(*format, body)->report(report_of(std::move(per_process), read, pids));
            return {200, format == OutputFormat::json ? "application/json" : "text/plain; version=0.0.4; charset=utf-8",
                    body.str()};
        });
    }
    return 0;
}

int cmd_report(const Args& args) {
    const bool folded = args.flag("--folded") || args.value("--format") == "folded";
    if (folded && args.flag("--serve")) usage_error("--serve answers with the sums, not folded stacks");
    const ResultKind kind = folded ? ResultKind::folded : args.flag("--reset") ? ResultKind::reset : ResultKind::report;
    const auto out = args.flag("--serve") ? nullptr : output_of(args, kind);
    if (folded) {
        if (!args.more_pids.empty()) usage_error("--folded reads one process's event stream: give one PID");
        if (args.flag("--hist")) usage_error("--folded and --hist exclude each other");
        return report_folded(args, *out);
    }
    if (args.flag("--since-last") + args.flag("--reset") + args.flag("--duration") > 1)
        usage_error("--since-last, --reset and --duration exclude each other");
    const double seconds = parse_duration(args);
    std::vector<pid_t> pids = {args.pid};
    pids.insert(pids.end(), args.more_pids.begin(), args.more_pids.end());
    std::vector<std::unique_ptr<TraceReader>> readers;
    for (pid_t pid : pids) readers.push_back(std::make_unique<TraceReader>(pid, TraceReader::Access::aggregates));
    if (args.flag("--serve")) return serve_report(args, readers, pids);
    if (args.flag("--at-exit"))
        for (pid_t pid : pids) wait_for_exit(pid);
    std::vector<std::vector<iprobe_rt_fn_stats>> since(readers.size());
    if (seconds > 0) {
        for (std::size_t i = 0; i < readers.size(); ++i) since[i] = readers[i]->sums();
        const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
        while (!g_stop && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    } else if (args.flag("--since-last")) {
        for (std::size_t i = 0; i < readers.size(); ++i) since[i] = readers[i]->baseline();
    }
    std::vector<std::vector<FunctionStats>> per_process;
    for (std::size_t i = 0; i < readers.size(); ++i) {
        const auto sums = readers[i]->sums();
        if (args.flag("--since-last") || args.flag("--reset")) readers[i]->mark_baseline(sums);
        per_process.push_back(readers[i]->functions(sums, since[i].empty() ? nullptr : &since[i]));
    }
    if (args.flag("--reset")) {
        out->reset({args.pid});
        return 0;
    }
    std::vector<const TraceReader*> read;
    for (const auto& r : readers) read.push_back(r.get());
    ReportResult result = report_of(std::move(per_process), read, pids);
    result.histograms = args.flag("--hist");
    out->report(result);
    return 0;
}


// `iprobe run`'s report: written once the program has exited, to stderr or
// to FILE (%p: the program's PID), whole or not at all (write_file_atomic).
// No reader: nothing was ever probed (the report says what never loaded).
void write_exit_report(TraceReader* reader, pid_t pid, const Args& args, const std::vector<std::string>& never_loaded) {
    ReportResult result;
    if (reader) {
        std::vector<std::vector<FunctionStats>> rows{reader->functions(reader->sums(), nullptr)};
        result = report_of(std::move(rows), {reader}, {pid});
    } else {
        result.pids = {pid};
    }
    result.never_loaded = never_loaded;
    std::ostringstream text;
    make_output(args.flag("--json") ? OutputFormat::json : OutputFormat::text, text)->report(result);
    const std::string report = text.str();
    std::string path = args.value("--report");
    if (path.empty()) {
        std::fwrite(report.data(), 1, report.size(), stderr);
        return;
    }
    for (std::size_t at; (at = path.find("%p")) != std::string::npos;) path.replace(at, 2, std::to_string(pid));
    write_file_atomic(path, report.data(), report.size());
}

std::string joined(const std::vector<std::string>& items) {
    std::string out;
    for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
    return out;
}

// The prober's side of one `iprobe run`: the probes enabled while the
// program is held at its start, the modules it loads later probed as it
// loads them (a thread of their own, while the caller waits for the
// program), and the report at its exit.
class RunProbes {
public:
    RunProbes(const AttachOptions& options, int prober_fd, pid_t program)
        : options_(options), pending_(options), prober_fd_(prober_fd), program_(program) {}
    RunProbes(const RunProbes&) = delete;
    RunProbes& operator=(const RunProbes&) = delete;
    ~RunProbes() { stop_serving(); }

    // Whether the program runs under probes (false: it could not be
    // executed, and said why).  Throws if the start's attach failed: the
    // program was told to exit.
    bool start() {
        const auto make_reader = [this] { open_reader(); };
        std::optional<AttachStats> started;
        if (pending_.empty()) {
            started = enable_when_held(prober_fd_, program_, options_, make_reader);
        } else {
            started = enable_loaded_when_held(
                prober_fd_, program_, options_, pending_, make_reader, [this] { started_as_ = executable_of(program_); },
                [this](const LaterAttach& a) { later(a); });
        }
        if (!started || pending_.empty()) {
            ::close(prober_fd_);
            prober_fd_ = -1;
            return started.has_value();
        }
        server_ = std::thread([this] {
            serve_later_loads(prober_fd_, program_, options_, pending_, [this](const LaterAttach& a) { later(a); });
            // The channel ended with the program alive: it exec'd (the
            // audit module's copy is close-on-exec), e.g. a wrapper script.
            const std::string now = executable_of(program_);
            if (!now.empty() && now != started_as_) exec_note_ = "; it exec'd " + now + ", which ran without probes";
        });
        return true;
    }

    // The program's wait status once it exited (iprobe is its parent).  No
    // waitpid while a later load may be attached: the kernel hands a
    // tracee's ptrace stops to any thread of its real parent's group that
    // waits for it, so the exit is awaited on a pidfd, the server stopped,
    // and only then the program reaped.
    int wait_for_child() {
        if (server_.joinable()) {
            const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, program_, 0));
            if (pidfd >= 0) {
                pollfd p{pidfd, POLLIN, 0};
                while (::poll(&p, 1, -1) < 0 && errno == EINTR) {
                }
                ::close(pidfd);
            }
            stop_serving();
        }
        int status = 0;
        while (::waitpid(program_, &status, 0) < 0) {
            if (errno == EINTR) continue;
            // reaped by an attach that saw it die: its status is gone
            return static_cast<int>(ExitCode::failure) << 8;
        }
        return status;
    }

    // After the program exited: the report, and iprobe run's exit status
    // (the program's, unless nothing at all could be probed; nullopt with
    // --exec, where iprobe's helper is not its parent).
    int finish(const Args& args, std::optional<int> program_status) {
        stop_serving();
        const std::vector<std::string> never = pending_.named();
        for (const auto& d : pending_.described())
            std::fprintf(stderr, "iprobe run: %s was never loaded by process %d: none of its functions were probed%s\n",
                         d.c_str(), static_cast<int>(program_), exec_note_.c_str());
        write_exit_report(reader_.get(), program_, args, never);
        if (reader_) return program_status.value_or(0);
        const std::string status =
            program_status ? " (it exited with status " + std::to_string(*program_status) + ")" : std::string();
        std::fprintf(stderr, "iprobe run: nothing was probed in process %d%s\n", static_cast<int>(program_),
                     status.c_str());
        return static_cast<int>(failure_);
    }

private:
    static std::string executable_of(pid_t pid) {
        std::error_code ec;
        return std::filesystem::read_symlink("/proc/" + std::to_string(pid) + "/exe", ec).string();
    }

    void open_reader() {
        if (!reader_) reader_ = std::make_unique<TraceReader>(program_, TraceReader::Access::aggregates);
    }

    void later(const LaterAttach& a) {
        if (a.stats) {
            open_reader();
            return;
        }
        std::fprintf(stderr, "iprobe run: %s loaded by process %d but not probed: %s\n", joined(a.named).c_str(),
                     static_cast<int>(program_), a.error.c_str());
        failure_ = a.code;
    }

    void stop_serving() {
        if (server_.joinable()) {
            ::shutdown(prober_fd_, SHUT_RDWR);
            server_.join();
        }
        if (prober_fd_ >= 0) ::close(prober_fd_);
        prober_fd_ = -1;
    }

    AttachOptions options_;
    PendingModules pending_;
    int prober_fd_;
    pid_t program_;
    std::unique_ptr<TraceReader> reader_;
    std::string started_as_, exec_note_;  // the program's executable; what it exec'd, said with what never loaded
    ExitCode failure_ = ExitCode::not_found;  // when nothing was probed
    std::thread server_;
};

// LD_AUDIT's module for a run that names modules (they may be loaded later).
std::string audit_for(const AttachOptions& options, const std::string& runtime) {
    return PendingModules(options).empty() ? std::string() : run_audit_library(runtime);
}

[[noreturn]] void exec_or_exit(const Args& args, const std::string& runtime, int program_fd, const std::string& audit) {
    exec_held(args.program, runtime, program_fd, audit);
    const int err = errno;
    std::fprintf(stderr, "iprobe run: cannot run %s: %s\n", args.program.front().c_str(), std::strerror(err));
    ::_exit(err == ENOENT ? 127 : 126);
}

volatile sig_atomic_t g_forward_to = 0;

// Signals sent to iprobe (kill, a supervisor) go on to the program; the
// terminal's (Ctrl-C, Ctrl-\) reach it directly, as the same process group.
void forward_signal(int sig, siginfo_t* info, void*) {
    if (g_forward_to > 0 && info->si_code != SI_KERNEL) ::kill(static_cast<pid_t>(g_forward_to), sig);
}

int exit_status_of(int status) {
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return static_cast<int>(ExitCode::failure);
}

// iprobe stays the program's parent: waits for it, reports, exits as it did.
int run_as_child(const Args& args, const AttachOptions& options, const std::string& runtime, HoldChannel channel) {
    const std::string audit = audit_for(options, runtime);
    const pid_t child = ::fork();
    if (child < 0) throw_errno("fork");
    if (child == 0) {
        ::close(channel.prober);
        exec_or_exit(args, runtime, channel.program, audit);
    }
    ::close(channel.program);
    RunProbes probes(options, channel.prober, child);
    bool started = false;
    try {
        started = probes.start();
    } catch (...) {
        int status = 0;
        while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
        }
        throw;
    }
    int status = 0;
    if (!started) {
        while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
        }
        return exit_status_of(status);
    }
    g_forward_to = child;
    struct sigaction sa {};
    sa.sa_sigaction = forward_signal;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2}) ::sigaction(sig, &sa, nullptr);
    return probes.finish(args, exit_status_of(probes.wait_for_child()));
}

// The program takes iprobe's place; a helper, moved out of its process tree
// (it is not the program's child, so nothing waiting for the program's
// children sees it) and out of the terminal's signals, probes it and writes
// the report after it exits.
int run_in_place(const Args& args, const AttachOptions& options, const std::string& runtime, HoldChannel channel) {
    const std::string audit = audit_for(options, runtime);
    const pid_t program = ::getpid();
    const pid_t middle = ::fork();
    if (middle < 0) throw_errno("fork");
    if (middle == 0) {
        const pid_t helper = ::fork();
        if (helper != 0) ::_exit(helper < 0 ? 1 : 0);
        ::setsid();
        ::close(channel.program);
        const int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
        if (null >= 0) {
            ::dup2(null, STDIN_FILENO);
            ::dup2(null, STDOUT_FILENO);
        }
        const pid_t self = ::getpid();
        if (::write(channel.prober, &self, sizeof self) != sizeof self) ::_exit(1);
        ::_exit(run_reporting_errors("iprobe run", [&] {
            RunProbes probes(options, channel.prober, program);
            if (!probes.start()) return 0;
            wait_for_exit(program);
            return probes.finish(args, std::nullopt);  // its status is its parent's to see
        }));
    }
    ::close(channel.prober);
    int status = 0;
    while (::waitpid(middle, &status, 0) < 0 && errno == EINTR) {
    }
    pid_t helper = 0;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 ||
        ::read(channel.program, &helper, sizeof helper) != sizeof helper)
        throw Error("cannot start iprobe run's helper process");
    ::prctl(PR_SET_PTRACER, static_cast<unsigned long>(helper), 0, 0, 0);  // Yama, where present
    exec_or_exit(args, runtime, channel.program, audit);
}

// One long-lived agent for the process (the launcher's, in a clone): its
// sources loaded once, requests on stdin, replies and the trace on stdout.
int cmd_agent(const Args& args) {
    AgentOptions o;
    o.pid = args.pid;
    o.probe_sources = args.probes;
    o.attach = attach_options_of(args);
    return serve_agent(o, STDIN_FILENO, STDOUT_FILENO);
}

int cmd_run(const Args& args) {
    AttachOptions options = attach_options_of(args);
    const std::string runtime = runtime_to_preload(options);
    options.runtime_library = runtime;
    if (args.flag("--exec")) return run_in_place(args, options, runtime, HoldChannel::open());
    return run_as_child(args, options, runtime, HoldChannel::open());
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2 || std::strcmp(argv[1], "-h") == 0 || std::strcmp(argv[1], "--help") == 0) {
        std::cout << spec_of("attach|detach|status|trace|report|run|agent").help();
        return argc < 2 ? 2 : 0;
    }
    struct sigaction sa {};
    sa.sa_handler = [](int) {
        g_stop = 1;
        interrupt();  // an attach or detach undoes what it did, then ends with ExitCode::interrupted
    };
    ::sigaction(SIGINT, &sa, nullptr);
    ::sigaction(SIGTERM, &sa, nullptr);
    ::signal(SIGPIPE, SIG_IGN);
    return run_reporting_errors(std::string("iprobe ") + argv[1], [&] {
        const std::string command = argv[1];
        g_command = command;
        if (command == "patch") return run_patch(argc, argv);
        if (command != "attach" && command != "detach" && command != "status" && command != "trace" &&
            command != "report" && command != "run" && command != "agent")
            usage_error("unknown command '" + command + "'");
        const Args args = parse(argc, argv);
        if (command == "attach") return cmd_attach(args);
        if (command == "detach") return cmd_detach(args);
        if (command == "status") return cmd_status(args);
        if (command == "trace") return cmd_trace(args);
        if (command == "run") return cmd_run(args);
        if (command == "agent") return cmd_agent(args);
        return cmd_report(args);
    });
}
