#include <string>
#include <vector>

#include "commands.h"
#include "iprobe/hotpatch/attach_report.h"
#include "iprobe/hotpatch/condition.h"
#include "iprobe/launcher/retro.h"
#include "iprobe/proxy/framing.h"
#include "iprobe/support/args.h"
#include "iprobe/support/error.h"
#include "iprobe/support/number.h"

namespace iprobe::launcher::cli {
namespace {

const ArgSpec kSpec(
    "iprobe investigate",
    "usage: iprobe investigate DIR [--generation N] [--probes LIST] [--functions GLOB,...]\n"
    "                          [--speed X] [--compare MODE] [--trace] [--patch F=LIB.so[:SYMBOL]…]\n"
    "                          [--name NAME] [--json]",
    "Retro-logging: looks back at what a service did, with probes nobody thought\n"
    "of at the time.  DIR was written by `iprobe debug --record DIR`: for each\n"
    "generation of clones, production's checkpoint and the client input from\n"
    "then on.  investigate restores a fresh clone from a generation's checkpoint\n"
    "(its own namespaces, its own copies of the files), attaches the probes,\n"
    "replays the recorded input into it and prints the per-function report: the\n"
    "calls that input caused.  The clone's replies are compared with\n"
    "production's replies as recorded: how faithful the replay was.  The clone\n"
    "is removed at the end; production and DIR are not touched.\n"
    "With --patch F=LIB.so[:SYMBOL] the clone runs F replaced by SYMBOL of LIB.so\n"
    "(`iprobe patch`) during the replay, and every reply the patch changed is\n"
    "listed (\"changed\", then \"patch-effect\"): the same changes a live\n"
    "`iprobe debug --patch` session would have shown on that input.",
    {
        {"--generation", "N", "which generation (default: the newest)"},
        {"--probes", "LIST", "probe list(s) to attach (default: the service's executable)"},
        {"--functions", "GLOB,...", "only probes of functions matching a GLOB"},
        {"--args", "", "the probes record each call's arguments (typed from DWARF)"},
        {"--retval", "", "the probes record each call's return value"},
        {"--backtrace", "DEPTH", "the probes record each call's callers, at most DEPTH (default 8)", {}, true},
        {"--when", "EXPR", "the probes record only calls EXPR holds for (as iprobe attach --when)"},
        {"--min-duration", "TIME", "the probes record only calls at least TIME long (2ms, 500us)"},
        {"--speed", "X", "pacing: 0 (default) as fast as possible, 1 as recorded, X times faster"},
        {"--compare", "MODE", "reply comparison: auto (default: as the session compared), resp,\n"
                              "http, stream or off"},
        {"--trace", "", "also stream the clone's events (trace) on stdout"},
        {"--patch", "F=LIB.so[:SYMBOL]", "replace function F by SYMBOL (default F) of LIB.so in the clone\n"
                                         "and list the replies it changes (repeatable)"},
        {"--name", "NAME", "the clone's name (default iprobe-investigate-PID)"},
        {"--json", "", "JSON lines on stdout: clone, attached, trace, replay, report"},
    },
    "exit codes: 0 ok (replies as production's, or any with --patch), 1 failed or the replies differed,\n"
    "2 usage, 3 bad input, 4 permission, 5 not found, 7 unavailable");

}  // namespace

int investigate_main(const std::vector<std::string>& args) {
    const auto parsed = kSpec.parse_or_print_help(args);
    if (!parsed) return 0;
    const ParsedArgs& a = *parsed;
    if (a.positionals().size() != 1) kSpec.fail("give one recording directory (iprobe debug --record DIR)");
    InvestigateOptions o;
    o.dir = a.positionals().front();
    if (a.has("--generation"))
        o.generation = static_cast<int>(parse_unsigned_or_usage(a.value("--generation"), "--generation", 1, 999999));
    o.probes = a.value("--probes");
    o.functions = a.value("--functions");
    o.values = hotpatch::value_options_of(a.has("--args"), a.has("--retval"), a.has("--backtrace"), a.value("--backtrace"));
    o.when = a.value("--when");
    o.min_duration = a.value("--min-duration");
    // Syntax first, before anything is cloned (exit 3 with a caret).
    if (!o.when.empty()) (void)hotpatch::Condition::parse(o.when);
    if (!o.min_duration.empty()) (void)hotpatch::Condition::min_duration(o.min_duration);
    if (a.has("--speed")) o.speed = parse_decimal_or_usage(a.value("--speed"), "--speed", 0, 1e6);
    if (a.has("--compare")) {
        o.compare = a.value("--compare");
        if (o.compare != "auto") proxy::parse_protocol(o.compare);
    }
    o.trace = a.has("--trace");
    if (o.trace && o.probes.empty() && o.functions.empty()) kSpec.fail("--trace streams probe events: give --functions or --probes");
    o.name = a.value("--name");
    o.json = a.has("--json");
    o.patches = a.values("--patch");
    return run_investigate(o);
}

}  // namespace iprobe::launcher::cli
