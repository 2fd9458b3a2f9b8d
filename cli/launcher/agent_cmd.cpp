#include <cstdio>
#include <string>
#include <vector>

#include "commands.h"
#include "iprobe/launcher/remote.h"
#include "iprobe/support/error.h"

namespace iprobe::launcher::cli {
namespace {

const char* const kUsage =
    "usage: iprobe clone-agent --listen ADDR:PORT --state-dir DIR\n"
    "\n"
    "Receives clones on the host that is to run them (docs/remote-clone.md):\n"
    "`iprobe clone PID --to ADDR:PORT` on production's host checkpoints the\n"
    "service with its memory streamed to a CRIU page server this agent starts on\n"
    "ADDR, sends the rest of the checkpoint and the clone's file snapshots over\n"
    "the control connection, and the agent restores the clone here, in this\n"
    "host's network namespace and a PID namespace of its own. The clone serves on\n"
    "this host's addresses; point `iprobe mirror --debug` at them.\n"
    "\n"
    "Requests are served one at a time. On SIGINT or SIGTERM the agent destroys\n"
    "every clone it made and exits.\n"
    "\n"
    "  --listen ADDR:PORT   control connections (and ADDR for the page servers)\n"
    "  --state-dir DIR      images, snapshots and logs, one directory per clone\n"
    "\n"
    "Needs root and CRIU >= 4.2 (scripts/setup). The files the service uses (its\n"
    "binary, libraries, configuration) must exist here at the same paths.\n"
    "Exit codes: 0 stopped by a signal, 2 usage, 4 not root, 6 address in use,\n"
    "7 CRIU missing.\n";

}  // namespace

int agent_main(const std::vector<std::string>& args) {
    AgentOptions o;
    for (std::size_t i = 0; i < args.size(); ++i) {
        const std::string& a = args[i];
        auto value = [&]() -> const std::string& {
            if (i + 1 >= args.size()) throw Error(a + " needs a value\n" + kUsage, ExitCode::usage);
            return args[++i];
        };
        if (a == "-h" || a == "--help") {
            std::fputs(kUsage, stdout);
            return 0;
        } else if (a == "--listen") {
            o.listen = value();
        } else if (a == "--state-dir") {
            o.state_dir = value();
        } else {
            throw Error("unknown argument " + a + "\n" + kUsage, ExitCode::usage);
        }
    }
    if (o.listen.empty() || o.state_dir.empty())
        throw Error(std::string("--listen and --state-dir are required\n") + kUsage, ExitCode::usage);
    o.progress = [](const std::string& line) {
        std::fprintf(stderr, "iprobe clone-agent: %s\n", line.c_str());
        std::fflush(stderr);
    };
    run_clone_agent(o);
    return 0;
}

}  // namespace iprobe::launcher::cli
