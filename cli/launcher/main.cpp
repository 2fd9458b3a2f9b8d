// iprobe-launcher: `iprobe clone` and `iprobe debug` (the dispatcher passes
// the subcommand as argv[1]).
#include <cstdio>
#include <string>
#include <vector>

#include "commands.h"
#include "iprobe/support/error.h"

namespace iprobe::launcher::cli {

int parse_pid(const std::string& text) {
    size_t used = 0;
    long v = 0;
    try {
        v = std::stol(text, &used);
    } catch (...) {
        used = 0;
    }
    if (used != text.size() || v <= 0 || v > (1 << 22))
        throw Error("'" + text + "' is not a process ID", ExitCode::usage);
    return static_cast<int>(v);
}

}  // namespace iprobe::launcher::cli

int main(int argc, char** argv) {
    using namespace iprobe;
    if (argc < 2) {
        std::fprintf(stderr, "usage: iprobe clone|debug ... (see `iprobe clone --help`, `iprobe debug --help`)\n");
        return static_cast<int>(ExitCode::usage);
    }
    std::string cmd = argv[1];
    std::vector<std::string> args(argv + 2, argv + argc);
    return run_reporting_errors("iprobe " + cmd, [&] {
        if (cmd == "clone") return launcher::cli::clone_main(args);
        if (cmd == "debug") return launcher::cli::debug_main(args);
        std::fprintf(stderr, "iprobe-launcher: unknown subcommand '%s' (clone or debug)\n", cmd.c_str());
        return static_cast<int>(ExitCode::usage);
    });
}
