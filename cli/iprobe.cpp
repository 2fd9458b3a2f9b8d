// `iprobe`: the front door.  Each subcommand is implemented by a tool in
// libexec/iprobe (one per library area), the way git dispatches; so areas
// build, test and fail independently, and `iprobe` itself stays tiny.
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "iprobe/support/error.h"
#include "iprobe/support/install_layout.h"

namespace {

struct Subcommand {
    const char* name;
    const char* tool;  // executable in libexec/iprobe
    const char* summary;
};

constexpr Subcommand kSubcommands[] = {
    {"coldpatch", "iprobe-probes", "turn placeholder calls in a linked binary into NOPs, write FILE.probes"},
    {"list", "iprobe-probes", "show the probes of a binary or probe list"},
    {"attach", "iprobe-hotpatch", "enable probes in a running process"},
    {"detach", "iprobe-hotpatch", "disable probes, restoring the NOPs"},
    {"status", "iprobe-hotpatch", "show what is enabled in a process"},
    {"patch", "iprobe-hotpatch", "replace a function of a running process by one from a shared object"},
    {"trace", "iprobe-hotpatch", "stream a process's probe events live"},
    {"report", "iprobe-hotpatch", "per-function calls and latency of a traced process"},
    {"run", "iprobe-hotpatch", "start a program with probes on before its own code runs"},
    {"mirror", "iprobe-mirror", "proxy that duplicates live traffic to a debug copy"},
    {"replay", "iprobe-mirror", "replay a recorded traffic file into a service"},
    {"clone", "iprobe-launcher", "live-clone a running service into a sandbox (CRIU)"},
    {"clone-agent", "iprobe-launcher", "receive clones on a second host (clone --to)"},
    {"debug", "iprobe-launcher", "clone + mirror + probes in one command"},
    {"investigate", "iprobe-launcher", "replay recorded input into a fresh clone with new probes"},
};

void print_usage(std::FILE* out) {
    std::fprintf(out,
                 "usage: iprobe <command> [options]\n"
                 "       iprobe <command> --help\n\n"
                 "Debug production services while they run.\n\ncommands:\n");
    for (const auto& s : kSubcommands) std::fprintf(out, "  %-10s %s\n", s.name, s.summary);
    std::fprintf(out,
                 "\nrelated tools: iprobe-cc, iprobe-c++ (compiler wrappers), fperf (profiler)\n"
                 "exit codes: 0 ok, 1 failed, 2 usage, 3 bad input, 4 permission, 5 not found,\n"
                 "            6 busy, 7 unavailable\n");
}

std::string libexec_dir() {
    if (const char* env = std::getenv("IPROBE_LIBEXEC_DIR")) return env;
    return iprobe::InstallLayout::current().libexec().string();
}

}  // namespace

int main(int argc, char** argv) {
    using iprobe::ExitCode;
    if (argc < 2) {
        print_usage(stderr);
        return static_cast<int>(ExitCode::usage);
    }
    const std::string_view cmd = argv[1];
    if (cmd == "-h" || cmd == "--help" || cmd == "help") {
        if (cmd == "help" && argc > 2) {
            char help[] = "--help";
            char* args[] = {argv[0], argv[2], help, nullptr};
            return main(3, args);
        }
        print_usage(stdout);
        return 0;
    }
    if (cmd == "--version" || cmd == "version") {
        std::printf("iprobe %s\n", IPROBE_VERSION);
        return 0;
    }
    for (const auto& s : kSubcommands) {
        if (cmd != s.name) continue;
        const std::string tool = libexec_dir() + "/" + s.tool;
        argv[0] = const_cast<char*>(tool.c_str());
        ::execv(tool.c_str(), argv);
        std::fprintf(stderr, "iprobe: cannot run %s: %s (is iprobe installed completely?)\n",
                     tool.c_str(), std::strerror(errno));
        return static_cast<int>(ExitCode::unavailable);
    }
    std::fprintf(stderr, "iprobe: unknown command '%s'; see 'iprobe --help'\n", argv[1]);
    return static_cast<int>(ExitCode::usage);
}
