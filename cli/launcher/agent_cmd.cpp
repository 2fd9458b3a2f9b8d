#include <cstdio>
#include <string>
#include <vector>

#include "commands.h"
#include "iprobe/launcher/remote.h"
#include "iprobe/support/args.h"
#include "iprobe/support/error.h"

namespace iprobe::launcher::cli {
namespace {

const ArgSpec kSpec(
    "iprobe clone-agent", "usage: iprobe clone-agent --listen ADDR:PORT --state-dir DIR",
    "Receives clones on the host that is to run them (docs/remote-clone.md):\n"
    "`iprobe clone PID --to ADDR:PORT` on production's host checkpoints the\n"
    "service with its memory streamed to a CRIU page server this agent starts on\n"
    "ADDR, sends the rest of the checkpoint and the clone's file snapshots over\n"
    "the control connection, and the agent restores the clone here, in this\n"
    "host's network namespace and a PID namespace of its own. The clone serves on\n"
    "this host's addresses; point `iprobe mirror --debug` at them.\n"
    "\n"
    "Requests are served one at a time. On SIGINT or SIGTERM the agent destroys\n"
    "every clone it made and exits.",
    {
        {"--listen", "ADDR:PORT", "control connections (and ADDR for the page servers)"},
        {"--state-dir", "DIR", "images, snapshots and logs, one directory per clone"},
    },
    "Needs root and CRIU >= 4.2 (scripts/setup). The files the service uses (its\n"
    "binary, libraries, configuration) must exist here at the same paths.\n"
    "Exit codes: 0 stopped by a signal, 2 usage, 4 not root, 6 address in use,\n"
    "7 CRIU missing.");

}  // namespace

int agent_main(const std::vector<std::string>& args) {
    const auto parsed = kSpec.parse_or_print_help(args);
    if (!parsed) return 0;
    const ParsedArgs& a = *parsed;
    if (!a.positionals().empty()) kSpec.fail("unexpected argument '" + a.positionals().front() + "'");
    AgentOptions o;
    o.listen = a.value("--listen");
    o.state_dir = a.value("--state-dir");
    if (o.listen.empty() || o.state_dir.empty()) kSpec.fail("--listen and --state-dir are required");
    o.progress = [](const std::string& line) {
        std::fprintf(stderr, "iprobe clone-agent: %s\n", line.c_str());
        std::fflush(stderr);
    };
    run_clone_agent(o);
    return 0;
}

}  // namespace iprobe::launcher::cli
