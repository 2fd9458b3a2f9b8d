// `fperf`: per-function counter profiles of a running program, with the
// profiler's own overhead kept inside a budget.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "iprobe/fperf/events.h"
#include "iprobe/fperf/profile.h"
#include "iprobe/fperf/record.h"
#include "iprobe/support/args.h"
#include "iprobe/support/error.h"
#include "iprobe/support/file.h"
#include "iprobe/support/glob.h"
#include "iprobe/support/json.h"
#include "iprobe/support/number.h"

namespace {

using iprobe::Error;
using iprobe::ExitCode;
using iprobe::ArgSpec;
using iprobe::ParsedArgs;

constexpr const char* kUsage =
    "usage: fperf record [options] --pid PID\n"
    "       fperf record [options] -- PROGRAM [ARGS...]\n"
    "       fperf report [-i fperf.data] [--json|--csv] [--svg OUT.svg] [--limit N]\n"
    "       fperf events [--json] list the events this machine can count, and who counts each\n"
    "\n"
    "Counts every call of the selected functions and samples counter deltas\n"
    "(wall time, thread CPU time, counter events) over as many calls as the\n"
    "overhead budget allows; every function that runs gets at least one sample.\n"
    "\n"
    "Events are counted by PAPI where it can, and by the kernel (perf_event_open)\n"
    "where it cannot: the kernel's software events (page faults, context switches,\n"
    "migrations, task clock) always, hardware events wherever the kernel has a PMU,\n"
    "even one libpfm4 does not know.  FPERF_PAPI=off leaves PAPI out entirely.\n";

ArgSpec record_spec() {
    ArgSpec spec(
        "fperf record", "usage: fperf record [options] --pid PID\n       fperf record [options] -- PROGRAM [ARGS...]",
        "-- PROGRAM ARGS starts PROGRAM with the handler preloaded and profiles it to\n"
        "its exit (programs built with iprobe-cc get their probes routed by hotpatch;\n"
        "plain -finstrument-functions builds call the handler directly).",
        {
            {"--pid", "PID", "profile a running process: hotpatch routes its probes to\n"
                             "the fperf handler (injected with dlopen when absent)", "-p"},
            {"--probes", "LIST", "probe list or coldpatched binary (default: the target's\n"
                                 "executable and its FILE.probes); repeatable"},
            {"--functions", "GLOB", "only functions matching GLOB (comma list, repeatable)"},
            {"--events", "E1,E2", "PAPI preset or native names, perf's names (page-faults,\n"
                                  "cs, cycles, ...) or raw codes (r01c2) (default: PAPI_TOT_CYC,\n"
                                  "PAPI_TOT_INS, PAPI_L1_DCM, perf::PAGE-FAULTS,\n"
                                  "perf::CONTEXT-SWITCHES); wall and CPU time are always measured", "-e"},
            {"--strict", "", "an unavailable --events entry is an error (exit 7); without\n"
                             "it the event is reported unavailable and the rest measured"},
            {"--budget", "P%", "overhead budget, share of wall time (default 5%);\n"
                               "'none' samples every call"},
            {"--no-budget", "", "the same as --budget none"},
            {"--interval", "T", "quota refill period (default 100ms; units us, ms, s)"},
            {"--duration", "S", "stop after S seconds (default: when the target exits or on Ctrl-C)"},
            {"--output", "FILE", "output (default fperf.data)", "-o"},
            {"--handler", "PATH", "the handler library (default: the installed one; FPERF_HANDLER)"},
            {"--table-slots", "N", "function table size (default 65536)"},
            {"--keep-probes", "", "never remove the probes of functions too hot to count\n"
                                  "within the budget (exact call counts; higher overhead)"},
            {"--quiet", "", "no progress messages", "-q"},
        });
    spec.command_after_dashes();
    return spec;
}

const ArgSpec kReportSpec(
    "fperf report", "usage: fperf report [-i fperf.data] [--json|--csv] [--svg OUT.svg] [--limit N] [--top N]",
    "Per function: calls seen, samples taken, mean per sampled call of wall time,\n"
    "CPU time and each measured event, and its share of the estimated total\n"
    "(mean x calls).  Unavailable events are listed, never shown as zeros.",
    {
        {"--input", "FILE", "the profile to read (default fperf.data)", "-i"},
        {"--json", "", "the profile as JSON"},
        {"--csv", "", "the table as CSV"},
        {"--svg", "OUT.svg", "also draw the profile as an SVG chart"},
        {"--limit", "N", "table rows (default 30, 0 = all)"},
        {"--top", "N", "bars per panel in the SVG (default 12)"},
    });

const ArgSpec kEventsSpec("fperf events", "usage: fperf events [--json]",
                          "Lists the events this machine can count, and who counts each (PAPI or the kernel).",
                          {{"--json", "", "the list as JSON"}});

[[noreturn]] void usage_error(const std::string& message) {
    throw Error(message + " (see `fperf --help`)", ExitCode::usage);
}

double parse_number(const std::string& text, const std::string& what) {
    try {
        std::size_t used = 0;
        const double v = std::stod(text, &used);
        if (used != text.size() || !std::isfinite(v) || v < 0) throw std::invalid_argument(text);
        return v;
    } catch (const std::exception&) {
        usage_error("bad " + what + " '" + text + "'");
    }
}

std::uint64_t parse_interval_ns(std::string text) {
    double scale = 1e6;  // plain numbers are milliseconds
    for (auto [suffix, s] : {std::pair{"us", 1e3}, {"ms", 1e6}, {"s", 1e9}})
        if (text.size() > std::strlen(suffix) && text.ends_with(suffix)) {
            text.resize(text.size() - std::strlen(suffix));
            scale = s;
            break;
        }
    const double ns = parse_number(text, "interval") * scale;
    if (ns < 1e6 || ns > 60e9) usage_error("--interval must be between 1ms and 60s");
    return static_cast<std::uint64_t>(ns);
}

int cmd_record(int argc, char** argv) {
    const ArgSpec spec = record_spec();
    const auto parsed = spec.parse_or_print_help(argc, argv, 2);
    if (!parsed) return 0;
    const ParsedArgs& a = *parsed;
    if (!a.positionals().empty()) spec.fail("unexpected argument '" + a.positionals().front() + "'");
    iprobe::fperf::RecordOptions o;
    o.command = a.command();
    if (a.has("--pid")) o.pid = iprobe::parse_pid_or_usage(a.value("--pid"), "--pid");
    o.probe_sources = a.values("--probes");
    for (const auto& list : a.values("--functions"))
        for (auto& g : iprobe::split_list(list)) o.function_globs.push_back(g);
    for (const auto& list : a.values("--events"))
        for (auto& e : iprobe::split_list(list)) o.events.push_back(e);
    o.events_given = a.has("--events");
    o.strict = a.has("--strict");
    if (a.has("--budget")) {
        std::string v = a.value("--budget");
        if (v == "none" || v == "off" || v == "unlimited") {
            o.unlimited = true;
        } else {
            if (!v.empty() && v.back() == '%') v.pop_back();
            o.budget = parse_number(v, "budget") / 100.0;
            if (o.budget > 10) usage_error("--budget above 1000% makes no sense; use --budget none");
            o.unlimited = false;
        }
    }
    if (a.has("--no-budget")) o.unlimited = true;
    if (a.has("--interval")) o.interval_ns = parse_interval_ns(a.value("--interval"));
    if (a.has("--duration")) {
        std::string v = a.value("--duration");
        if (v.size() > 1 && v.back() == 's') v.pop_back();
        o.duration_s = parse_number(v, "duration");
    }
    if (a.has("--output")) o.output = a.value("--output");
    o.handler_library = a.value("--handler");
    if (a.has("--table-slots")) {
        o.table_slots = static_cast<std::uint32_t>(parse_number(a.value("--table-slots"), "table size"));
        if (o.table_slots < 2 || o.table_slots > (1u << 24)) usage_error("--table-slots must be 2..16777216");
    }
    o.quiet = a.has("--quiet");
    o.keep_probes = a.has("--keep-probes");
    if (a.command().empty() && std::find(argv + 2, argv + argc, std::string_view("--")) != argv + argc)
        usage_error("nothing to run after --");
    if (o.pid == 0 && o.command.empty()) usage_error("fperf record needs --pid PID or -- PROGRAM");
    if (o.events_given && o.events.empty()) usage_error("--events needs at least one name");
    return iprobe::fperf::record(o);
}

int cmd_report(int argc, char** argv) {
    const auto parsed = kReportSpec.parse_or_print_help(argc, argv, 2);
    if (!parsed) return 0;
    const ParsedArgs& a = *parsed;
    if (!a.positionals().empty()) kReportSpec.fail("unexpected argument '" + a.positionals().front() + "'");
    const std::string input = a.value("--input", "fperf.data"), svg = a.value("--svg");
    enum { table, json, csv } format = a.has("--json") ? json : a.has("--csv") ? csv : table;
    const std::size_t limit = a.has("--limit") ? static_cast<std::size_t>(parse_number(a.value("--limit"), "limit")) : 30;
    const std::size_t top = a.has("--top") ? static_cast<std::size_t>(parse_number(a.value("--top"), "top")) : 12;
    if (top == 0) usage_error("--top must be at least 1");
    const auto profile = iprobe::fperf::Profile::load(input);
    if (!svg.empty()) {
        const auto text = iprobe::fperf::render_svg(profile, top);
        iprobe::write_file_atomic(svg, text.data(), text.size());
    }
    const std::string out = format == json  ? iprobe::fperf::render_json(profile)
                            : format == csv ? iprobe::fperf::render_csv(profile)
                                            : iprobe::fperf::render_table(profile, limit);
    std::fputs(out.c_str(), stdout);
    if (!svg.empty() && format == table) std::printf("\nwrote %s\n", svg.c_str());
    return 0;
}

int cmd_events(int argc, char** argv) {
    const auto parsed = kEventsSpec.parse_or_print_help(argc, argv, 2);
    if (!parsed) return 0;
    const ParsedArgs& a = *parsed;
    if (!a.positionals().empty()) kEventsSpec.fail("unexpected argument '" + a.positionals().front() + "'");
    const bool json = a.has("--json");
    const auto events = iprobe::fperf::available_events();
    if (!json) {
        for (const auto& e : events) std::printf("%-40s %s\n", e.name.c_str(), iprobe::fperf::backend_name(e.source.backend));
        return 0;
    }
    iprobe::JsonWriter j;
    j.begin_array();
    for (const auto& e : events)
        j.begin_object().field("name", e.name).field("backend", iprobe::fperf::backend_name(e.source.backend)).end_object();
    j.end_array();
    std::printf("%s\n", j.str().c_str());
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    return iprobe::run_reporting_errors("fperf", [&] {
        if (argc < 2) {
            std::fputs(kUsage, stderr);
            return static_cast<int>(ExitCode::usage);
        }
        const std::string_view cmd = argv[1];
        if (cmd == "-h" || cmd == "--help" || cmd == "help") {
            std::fputs(kUsage, stdout);
            return 0;
        }
        if (cmd == "record") return cmd_record(argc, argv);
        if (cmd == "report") return cmd_report(argc, argv);
        if (cmd == "events") return cmd_events(argc, argv);
        usage_error("unknown command '" + std::string(cmd) + "'");
    });
}
