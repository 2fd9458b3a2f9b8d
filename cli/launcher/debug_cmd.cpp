#include <cstdio>
#include <string>
#include <vector>

#include "commands.h"
#include "iprobe/launcher/debug.h"
#include "iprobe/support/error.h"
#include "iprobe/support/number.h"

namespace iprobe::launcher::cli {
namespace {

const char* const kUsage =
    "usage: iprobe debug PID|--container NAME --listen ADDR:PORT --production ADDR:PORT\n"
    "                    [--probes LIST [--functions GLOB]] [--buffer SIZE] [--divergence MODE]\n"
    "                    [--recloning off|on-overflow|on-divergence|periodic:SECONDS]\n"
    "                    [--name NAME] [--json]\n"
    "\n"
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
    "Ctrl-C (or SIGTERM) removes the clone, its namespace and the mirror;\n"
    "production is left as it was.\n"
    "\n"
    "  --container NAME         production is podman container NAME: the clone is a\n"
    "                           new container (`iprobe clone --container`), fed at its\n"
    "                           own address, probes attached on its host PID (not\n"
    "                           yet with --recloning)\n"
    "  --buffer SIZE            mirror's per-connection buffer toward the clone\n"
    "  --recloning on-overflow  re-clone when a connection's copy overflowed its\n"
    "                           buffer (the clone has diverged from production)\n"
    "  --divergence MODE        the mirror compares the clone's replies with\n"
    "                           production's: auto (default: resp for redis-like\n"
    "                           services, http for web servers, off otherwise),\n"
    "                           resp, http, stream, or off\n"
    "  --recloning on-divergence  re-clone when a connection's replies differed\n"
    "                           (with --divergence auto on an unknown protocol: stream)\n"
    "  --recloning periodic:N   re-clone every N seconds\n"
    "  --name NAME              clone/namespace name (default iprobe-debug-PID)\n"
    "  --json                   JSON lines on stdout: the session's events, the\n"
    "                           clone's trace as {\"event\":\"trace\",...}, the\n"
    "                           mirror's final stats in the \"stopping\" event\n"
    "\n"
    "Needs root. Exit codes as `iprobe clone`; 7 also when iprobe-mirror or\n"
    "iprobe-hotpatch is not built.\n";

}  // namespace

int debug_main(const std::vector<std::string>& args) {
    DebugOptions o;
    auto value = [&](size_t& i) -> const std::string& {
        if (i + 1 >= args.size()) throw Error(args[i] + " needs a value\n" + kUsage, ExitCode::usage);
        return args[++i];
    };
    for (size_t i = 0; i < args.size(); ++i) {
        const std::string& a = args[i];
        if (a == "-h" || a == "--help") {
            std::fputs(kUsage, stdout);
            return 0;
        } else if (a == "--listen") {
            o.listen = value(i);
        } else if (a == "--production") {
            o.production = value(i);
        } else if (a == "--probes") {
            o.probes = value(i);
        } else if (a == "--functions") {
            o.functions = value(i);
        } else if (a == "--buffer") {
            o.buffer = value(i);
        } else if (a == "--divergence") {
            o.divergence = value(i);
            if (o.divergence != "auto" && o.divergence != "stream" && o.divergence != "resp" &&
                o.divergence != "http" && o.divergence != "off")
                throw Error("--divergence wants auto, resp, http, stream or off", ExitCode::usage);
        } else if (a == "--container") {
            o.container = value(i);
        } else if (a == "--name") {
            o.name = value(i);
        } else if (a == "--json") {
            o.json = true;
        } else if (a == "--recloning") {
            const std::string& v = value(i);
            if (v == "off") {
                o.recloning = DebugOptions::Recloning::off;
            } else if (v == "on-overflow") {
                o.recloning = DebugOptions::Recloning::on_overflow;
            } else if (v == "on-divergence") {
                o.recloning = DebugOptions::Recloning::on_divergence;
            } else if (v.rfind("periodic:", 0) == 0) {
                o.recloning = DebugOptions::Recloning::periodic;
                o.period_s = static_cast<int>(parse_unsigned_or_usage(v.substr(9), "--recloning periodic:SECONDS", 1, 86400 * 365));
            } else {
                throw Error("--recloning wants off, on-overflow, on-divergence or periodic:SECONDS", ExitCode::usage);
            }
        } else if (!a.empty() && a[0] == '-') {
            throw Error("unknown option " + a + "\n" + kUsage, ExitCode::usage);
        } else if (o.pid < 0) {
            o.pid = parse_pid(a);
        } else {
            throw Error("unexpected argument " + a + "\n" + kUsage, ExitCode::usage);
        }
    }
    if ((o.pid < 0) == o.container.empty() || o.listen.empty() || o.production.empty())
        throw Error(std::string("PID (or --container), --listen and --production are required\n") + kUsage,
                    ExitCode::usage);
    if (o.divergence == "off" && o.recloning == DebugOptions::Recloning::on_divergence)
        throw Error("--recloning on-divergence needs divergence checking; drop --divergence off", ExitCode::usage);
    return run_debug(o);
}

}  // namespace iprobe::launcher::cli
