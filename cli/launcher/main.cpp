// iprobe-launcher: `iprobe clone` and `iprobe debug` (the dispatcher passes
// the subcommand as argv[1]).
#include <cstdio>
#include <string>
#include <vector>

#include "commands.h"
#include "iprobe/support/error.h"
#include "iprobe/support/number.h"

namespace iprobe::launcher::cli {

int parse_pid(const std::string& text) { return parse_pid_or_usage(text); }

}  // namespace iprobe::launcher::cli

int main(int argc, char** argv) {
    using namespace iprobe;
    if (argc < 2) {
        std::fprintf(stderr, "usage: iprobe clone|clone-agent|debug|investigate ... (see `iprobe clone --help`, `iprobe debug --help`)\n");
        return static_cast<int>(ExitCode::usage);
    }
    std::string cmd = argv[1];
    std::vector<std::string> args(argv + 2, argv + argc);
    return run_reporting_errors("iprobe " + cmd, [&] {
        if (cmd == "clone") return launcher::cli::clone_main(args);
        if (cmd == "debug") return launcher::cli::debug_main(args);
        if (cmd == "clone-agent") return launcher::cli::agent_main(args);
        if (cmd == "investigate") return launcher::cli::investigate_main(args);
        std::fprintf(stderr, "iprobe-launcher: unknown subcommand '%s' (clone, clone-agent, debug or investigate)\n", cmd.c_str());
        return static_cast<int>(ExitCode::usage);
    });
}
