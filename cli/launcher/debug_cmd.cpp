#include <cstdio>
#include <string>
#include <vector>

#include "commands.h"
#include "iprobe/hotpatch/attach_report.h"
#include "iprobe/hotpatch/condition.h"
#include "iprobe/launcher/debug.h"
#include "iprobe/support/args.h"
#include "iprobe/support/error.h"
#include "iprobe/support/number.h"

namespace iprobe::launcher::cli {
namespace {

const ArgSpec kSpec(
    "iprobe debug",
    "usage: iprobe debug PID|--container NAME --listen ADDR:PORT|--capture --production ADDR:PORT\n"
    "                    [--probes LIST [--functions GLOB]] [--buffer SIZE] [--divergence MODE]\n"
    "                    [--recloning off|on-overflow|on-divergence|periodic:SECONDS]\n"
    "                    [--adapt] [--clones N] [--record DIR [--max-size SIZE]] [--no-trace | --lossless]\n"
    "                    [--patch F=LIB.so[:SYMBOL]…] [--name NAME] [--json]",
    "Debugs a running service on a live copy of it, with production's traffic:\n"
    "  1. clones PID with CRIU (`iprobe clone`) into its own network and PID\n"
    "     namespaces, connected to this host by a veth pair (10.213.x.y/30);\n"
    "  2. starts `iprobe mirror --listen ADDR:PORT --production ADDR:PORT` with\n"
    "     the clone as the debug side: clients talk to production through\n"
    "     --listen, the clone receives a copy of every request and its replies\n"
    "     are dropped; production never waits for the clone;\n"
    "  3. with --probes and/or --functions, attaches probes inside the clone\n"
    "     only (`iprobe attach`; LIST defaults to the clone's executable) and\n"
    "     streams the clone's trace (`iprobe trace`) on stdout.\n"
    "With --capture there is no --listen: the mirror captures production's own\n"
    "traffic off the wire (`iprobe mirror --capture`), so its clients keep\n"
    "talking to it as before and connections already open are mirrored from\n"
    "their next request (redis and HTTP services).\n"
    "Ctrl-C (or SIGTERM) removes the clone, its namespace and the mirror;\n"
    "production is left as it was.  When a generation of clones ends (a\n"
    "re-clone, or the end) its per-function report is printed (\"report\"):\n"
    "the clones' counts merged, and when each function was probed.\n"
    "With --patch F=LIB.so[:SYMBOL] (active debugging) the clones, never\n"
    "production, run F replaced by SYMBOL of LIB.so (`iprobe patch`), and every\n"
    "reply the patch changed is said (\"changed\": the request, production's\n"
    "reply, the patched clone's), with the total at the end (\"patch-effect\";\n"
    "docs/active-debugging.md).\n"
    "The debug window (how long a clone keeps up with production's traffic)\n"
    "and the three ways to stretch it: docs/debug-window.md.",
    {
        {"--listen", "ADDR:PORT", "where clients connect (the mirror's listening address)"},
        {"--capture", "", "no proxy: capture production's traffic on its port (lo for a\n"
                          "loopback address, else every interface) and feed the clone from it;\n"
                          "the capture starts before the checkpoint and the clone gets each\n"
                          "connection from the first request the checkpoint did not hold\n"
                          "(event capture-start: what it misses, if anything)"},
        {"--production", "ADDR:PORT", "the service's own address"},
        {"--container", "NAME", "production is podman container NAME: the clone is a\n"
                                "new container (`iprobe clone --container`), fed at its\n"
                                "own address, probes attached on its host PID (not\n"
                                "yet with --recloning)"},
        {"--probes", "LIST", "probe list(s) to attach in the clone (default: its executable's)"},
        {"--functions", "GLOB", "only probes of functions matching GLOB"},
        {"--args", "", "the probes record each call's arguments (typed from DWARF)"},
        {"--retval", "", "the probes record each call's return value"},
        {"--backtrace", "DEPTH", "the probes record each call's callers, at most DEPTH (default 8)", {}, true},
        {"--when", "EXPR", "the probes record only calls EXPR holds for (as iprobe attach --when)"},
        {"--min-duration", "TIME", "the probes record only calls at least TIME long (2ms, 500us)"},
        {"--buffer", "SIZE", "mirror's per-connection buffer toward the clone"},
        {"--divergence", "MODE", "the mirror compares the clone's replies with\n"
                                 "production's: auto (default: resp for redis-like\n"
                                 "services, http for web servers, off otherwise),\n"
                                 "resp, http, stream, or off"},
        {"--recloning", "WHEN", "on-overflow: re-clone when a connection's copy overflowed\n"
                                "its buffer (the clone has diverged from production);\n"
                                "on-divergence: when a connection's replies differed\n"
                                "(with --divergence auto on an unknown protocol: stream);\n"
                                "periodic:N: every N seconds; off (default)"},
        {"--adapt", "", "budget-limited instrumentation: the costliest probed functions\n"
                        "(calls x the measured cost of a probe) are turned off as a clone\n"
                        "falls behind (buffer fill, lag) and back on as it catches up;\n"
                        "every change is an \"adapt\" event"},
        {"--clones", "N", "N clones of one checkpoint, each fed the whole stream; the\n"
                          "probed functions are split among them (after the first generation\n"
                          "by measured cost), so each carries 1/N of the instrumentation"},
        {"--record", "DIR", "retro-logging: keep each generation's checkpoint and the input\n"
                            "from then on in DIR, for `iprobe investigate DIR`"},
        {"--max-size", "SIZE", "--record: bound on DIR (default 1G; K/M/G): the oldest\n"
                               "generations go first; a generation alone larger stops recording"},
        {"--no-trace", "", "no event stream: the aggregates only (reports, iprobe report)"},
        {"--lossless", "", "every event of the clones' trace: a clone's thread whose ring is full\n"
                           "waits for the trace reader instead of dropping (as iprobe trace\n"
                           "--lossless; the clone slows down and falls behind, production never)"},
        {"--patch", "F=LIB.so[:SYMBOL]", "replace function F by SYMBOL (default F) of LIB.so in the\n"
                                         "clones only and list the replies it changes (repeatable;\n"
                                         "needs --divergence resp|http|stream for an unknown protocol)"},
        {"--name", "NAME", "clone/namespace name (default iprobe-debug-PID)"},
        {"--json", "", "JSON lines on stdout: the session's events, the\n"
                       "clone's trace as {\"event\":\"trace\",...}, the\n"
                       "mirror's final stats in the \"stopping\" event"},
    },
    "Needs root. Exit codes as `iprobe clone`; 7 also when iprobe-mirror or\n"
    "iprobe-hotpatch is not built.");

DebugOptions::Recloning parse_recloning(const std::string& v, int& period_s) {
    if (v == "off") return DebugOptions::Recloning::off;
    if (v == "on-overflow") return DebugOptions::Recloning::on_overflow;
    if (v == "on-divergence") return DebugOptions::Recloning::on_divergence;
    if (v.rfind("periodic:", 0) == 0) {
        period_s = static_cast<int>(parse_unsigned_or_usage(v.substr(9), "--recloning periodic:SECONDS", 1, 86400 * 365));
        return DebugOptions::Recloning::periodic;
    }
    kSpec.fail("--recloning wants off, on-overflow, on-divergence or periodic:SECONDS");
}

}  // namespace

int debug_main(const std::vector<std::string>& args) {
    const auto parsed = kSpec.parse_or_print_help(args);
    if (!parsed) return 0;
    const ParsedArgs& a = *parsed;
    DebugOptions o;
    o.listen = a.value("--listen");
    o.capture = a.has("--capture");
    o.production = a.value("--production");
    o.probes = a.value("--probes");
    o.functions = a.value("--functions");
    o.values = hotpatch::value_options_of(a.has("--args"), a.has("--retval"), a.has("--backtrace"), a.value("--backtrace"));
    o.when = a.value("--when");
    o.min_duration = a.value("--min-duration");
    // Syntax first, before anything is cloned (exit 3 with a caret).
    if (!o.when.empty()) (void)hotpatch::Condition::parse(o.when);
    if (!o.min_duration.empty()) (void)hotpatch::Condition::min_duration(o.min_duration);
    o.buffer = a.value("--buffer");
    o.container = a.value("--container");
    o.name = a.value("--name");
    o.json = a.has("--json");
    o.patches = a.values("--patch");
    if (a.has("--divergence")) {
        o.divergence = a.value("--divergence");
        if (o.divergence != "auto" && o.divergence != "stream" && o.divergence != "resp" && o.divergence != "http" &&
            o.divergence != "off")
            kSpec.fail("--divergence wants auto, resp, http, stream or off");
    }
    if (a.has("--recloning")) o.recloning = parse_recloning(a.value("--recloning"), o.period_s);
    o.adapt = a.has("--adapt");
    o.trace = !a.has("--no-trace");
    o.lossless = a.has("--lossless");
    if (o.lossless && !o.trace) kSpec.fail("--lossless is about the event stream: drop --no-trace");
    if (a.has("--clones")) o.clones = static_cast<int>(parse_unsigned_or_usage(a.value("--clones"), "--clones", 1, 16));
    o.record_dir = a.value("--record");
    if (a.has("--max-size")) {
        if (o.record_dir.empty()) kSpec.fail("--max-size bounds --record DIR: give --record too");
        o.record_max_bytes = parse_size_or_usage(a.value("--max-size"), "--max-size");
    }
    if (o.adapt && o.probes.empty() && o.functions.empty())
        kSpec.fail("--adapt turns probes off and on: give --probes and/or --functions");
    if (a.positionals().size() > 1) kSpec.fail("unexpected argument '" + a.positionals()[1] + "'");
    if (!a.positionals().empty()) o.pid = parse_pid(a.positionals().front());
    if ((o.pid < 0) == o.container.empty() || (o.listen.empty() && !o.capture) || o.production.empty())
        kSpec.fail("PID (or --container), --listen (or --capture) and --production are required");
    if (o.capture && !o.listen.empty())
        kSpec.fail("--capture puts nothing in production's path: drop --listen (clients keep using --production)");
    if (!o.patches.empty() && o.recloning == DebugOptions::Recloning::on_divergence)
        kSpec.fail("--patch changes replies on purpose: --recloning on-divergence would re-clone at each; use another --recloning");
    if (!o.patches.empty() && o.divergence == "off")
        kSpec.fail("--patch lists the replies the patch changed: it needs --divergence resp, http or stream, not off");
    if (o.divergence == "off" && o.recloning == DebugOptions::Recloning::on_divergence)
        kSpec.fail("--recloning on-divergence needs divergence checking; drop --divergence off");
    return run_debug(o);
}

}  // namespace iprobe::launcher::cli
