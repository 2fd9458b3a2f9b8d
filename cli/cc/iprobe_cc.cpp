// iprobe-cc / iprobe-c++: drop-in compiler wrappers.  Compile steps get the
// placeholder flags, link steps are followed by an in-process coldpatch of
// the output; every other invocation (-E, -M, --version, configure's probes)
// reaches the real compiler untouched.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "iprobe/coldpatch/coldpatch.h"
#include "iprobe/support/error.h"
#include "iprobe/support/glob.h"
#include "iprobe/support/install_layout.h"

#ifndef IPROBE_CC_CXX
#define IPROBE_CC_CXX 0
#endif

namespace {

constexpr bool kCxx = IPROBE_CC_CXX;
constexpr const char* kSelf = kCxx ? "iprobe-c++" : "iprobe-cc";

constexpr char kHelp[] =
    "usage: %1$s [--flow=finstrument|entry|llvm] [--pad-threshold=N] COMPILER-ARGS...\n"
    "       %1$s --iprobe-help\n"
    "\n"
    "A drop-in C%2$s compiler: use it as CC/CXX (./configure CC=iprobe-cc, make CC=iprobe-cc,\n"
    "cmake -DCMAKE_C_COMPILER=iprobe-cc).  Every argument goes to the real compiler;\n"
    "--help, --version, -E, -M, -S, -c and the like behave exactly as the real compiler's.\n"
    "\n"
    "entry flow (default):\n"
    "  compile steps load iprobe's gcc plugin (lib/iprobe/iprobe_pad.so, when built\n"
    "  for this gcc; otherwise, and with clang, they add -fpatchable-function-entry=5,0):\n"
    "  five NOPs at the start of every function compiled out of line, nothing in inlined\n"
    "  copies.  The plugin keeps gcc's interprocedural register allocation, which the\n"
    "  option turns off.  It leaves small functions unpadded: fewer than N machine\n"
    "  instructions (--pad-threshold=N, default 64; 0 pads every function, as XRay's\n"
    "  -fxray-instruction-threshold), where the NOP would be a large share of each call.\n"
    "  Such a function is no probe lost: the probe list has it as a relocated entry (its\n"
    "  first instructions move to a trampoline when enabled, as for binaries nobody\n"
    "  prepared); one that cannot be relocated either is reported with the reason (and\n"
    "  by 'iprobe list --refused').  Link steps (an executable or shared object) leave gcc's records\n"
    "  of the pads out (lib/iprobe/iprobe-entry-records.ld: gcc 12 ties them to the wrong\n"
    "  section, and a discarded COMDAT copy would fail the link; not with -fuse-ld=gold)\n"
    "  and are followed by 'iprobe coldpatch' of the output, done in-process: each\n"
    "  function's NOPs become one 5-byte NOP, and OUTPUT.probes lists it (every function\n"
    "  symbol the link kept that starts with the pad) as the function's entry probe and,\n"
    "  served by the same site through a return trampoline, its exit probe.  Probes off\n"
    "  cost one NOP per call.  Padded functions without a symbol (a link with -s) are\n"
    "  reported.  A link without placeholders (configure's conftest) is left as it is.\n"
    "finstrument flow (--flow=finstrument or IPROBE_FLOW=finstrument):\n"
    "  compile steps add -finstrument-functions -fno-optimize-sibling-calls (so a void\n"
    "  function's exit hook stays a call, not a tail jump) and an exclusion of system headers\n"
    "  (gcc: -finstrument-functions-exclude-file-list=/usr/include,/usr/lib; clang has no\n"
    "  exclusion list, so it gets -finstrument-functions-after-inlining instead).  The hook\n"
    "  calls coldpatch turns into NOPs are probes, inlined copies included (with -g, attach\n"
    "  --args reads an inlined copy's arguments too); their argument set-up stays, so probes\n"
    "  off cost more.  Static links get distinct no-op hooks\n"
    "  (glibc's are one function).\n"
    "llvm flow (--flow=llvm or IPROBE_FLOW=llvm):\n"
    "  compile steps load the iprobe LLVM pass plugin instead (clang-14): a patchable entry\n"
    "  per selected function, described in the binary itself; links are not coldpatched.\n"
    "  (--mode=M and IPROBE_MODE are older spellings of --flow=M and IPROBE_FLOW.)\n"
    "\n"
    "environment:\n"
    "  IPROBE_CC, IPROBE_CXX   real compiler (default gcc / g++; clang-14 / clang++-14 in llvm flow)\n"
    "  IPROBE_FLOW             entry (default), finstrument or llvm\n"
    "  IPROBE_PAD_THRESHOLD    entry flow with the gcc plugin: as --pad-threshold=N\n"
    "  IPROBE_EXCLUDE          finstrument flow: comma-separated path fragments excluded from\n"
    "                          instrumentation (gcc only; default /usr/include,/usr/lib; empty: none)\n"
    "  IPROBE_CFLAGS           replaces all flags added to compile steps (space-separated)\n"
    "  IPROBE_GCC_PLUGIN       entry flow with gcc: 0 for -fpatchable-function-entry=5,0\n"
    "                          instead of the plugin, or the plugin's path\n"
    "  IPROBE_PASS_PLUGIN      the LLVM pass plugin (default <bindir>/../lib/IProbePass.so)\n"
    "  IPROBE_COLDPATCH=0      leave the link as the compiler made it (the finstrument flow's\n"
    "                          hook calls run glibc's no-op hooks): a baseline for benchmarks\n"
    "  IPROBE_CC_VERBOSE=1     print what the wrapper does (added flags, coldpatch results)\n"
    "  IPROBE_CC_QUIET=1       no coldpatch summary line on link steps (printed only when\n"
    "                          stderr is a terminal, so configure scripts see a clean stderr)\n"
    "\n"
    "The wrapper's own help is --iprobe-help: --help belongs to the real compiler.\n";

enum class Mode { finstrument, entry, llvm };

// "finstrument" | "entry" | "llvm"; anything else is a usage error.
Mode parse_flow(std::string_view text) {
    if (text == "finstrument") return Mode::finstrument;
    if (text == "entry") return Mode::entry;
    if (text == "llvm") return Mode::llvm;
    throw iprobe::Error("unknown flow '" + std::string(text) + "' (expected finstrument, entry or llvm)",
                        iprobe::ExitCode::usage);
}

// A count of machine instructions, as the plugin takes it; anything else is
// a usage error.
std::string parse_pad_threshold(std::string_view text) {
    const bool digits = !text.empty() && text.size() <= 7 && text.find_first_not_of("0123456789") == text.npos;
    if (!digits)
        throw iprobe::Error("--pad-threshold wants a count of machine instructions (0 pads every function), not '" +
                                std::string(text) + "'",
                            iprobe::ExitCode::usage);
    return std::string(text);
}

struct Invocation {
    std::vector<std::string> args;  // compiler arguments, without ours
    Mode mode = Mode::entry;
    bool preprocess_only = false;   // -E, -M, -MM
    bool stops_before_link = false; // -c, -S, -E, -M, -MM
    bool relocatable = false;       // -r: partial link, not a module
    bool is_static = false;         // -static, -static-pie: glibc's aliased hooks
    bool has_inputs = false;
    std::string output;             // -o value, "" = default
    std::string pad_threshold;      // --pad-threshold=N, "" = the plugin's default
};

bool verbose() { return std::getenv("IPROBE_CC_VERBOSE") && *std::getenv("IPROBE_CC_VERBOSE"); }

void note(const std::string& text) { std::fprintf(stderr, "%s: %s\n", kSelf, text.c_str()); }

bool file_exists(const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0;
}

// Options whose value is the next argument (when not joined).
bool takes_separate_value(std::string_view a) {
    static constexpr std::string_view kOptions[] = {
        "-o", "-I", "-D", "-U", "-include", "-imacros", "-isystem", "-iquote", "-idirafter", "-iprefix",
        "-iwithprefix", "-iwithprefixbefore", "-isysroot", "-x", "-MF", "-MT", "-MQ", "-L", "-l", "-Xlinker",
        "-Xassembler", "-Xpreprocessor", "-Xclang", "-T", "-u", "-e", "-z", "-aux-info", "--param", "-target",
        "-arch", "-dumpbase", "-dumpdir", "-G", "-B", "-isystem-after", "-Xanalyzer", "-mllvm"};
    for (auto o : kOptions)
        if (a == o) return true;
    return false;
}

Invocation parse(int argc, char** argv) {
    Invocation inv;
    for (const char* name : {"IPROBE_MODE", "IPROBE_FLOW"})
        if (const char* m = std::getenv(name); m && *m) inv.mode = parse_flow(m);
    if (const char* t = std::getenv("IPROBE_PAD_THRESHOLD"); t && *t) inv.pad_threshold = parse_pad_threshold(t);
    for (int i = 1; i < argc; ++i) {
        const std::string_view a = argv[i];
        if (a.starts_with("--flow=") || a.starts_with("--mode=")) {
            inv.mode = parse_flow(a.substr(7));
            continue;
        }
        if (a.starts_with("--pad-threshold=")) {
            inv.pad_threshold = parse_pad_threshold(a.substr(16));
            continue;
        }
        inv.args.emplace_back(a);
        if (takes_separate_value(a) && i + 1 < argc) {
            if (a == "-o") inv.output = argv[i + 1];
            if (a == "-Xlinker" && std::string_view(argv[i + 1]) == "-r") inv.relocatable = true;
            inv.args.emplace_back(argv[++i]);
            continue;
        }
        if (a.starts_with("-o") && a.size() > 2) inv.output = a.substr(2);
        if (a == "-E" || a == "-M" || a == "-MM") inv.preprocess_only = true;
        if (a == "-E" || a == "-M" || a == "-MM" || a == "-c" || a == "-S" || a == "-fsyntax-only" || a == "-###")
            inv.stops_before_link = true;
        if (a == "-r" || a == "-Wl,-r" || a == "--relocatable") inv.relocatable = true;
        if (a == "-static" || a == "-static-pie") inv.is_static = true;
        if (a == "-" || (!a.empty() && a[0] != '-')) inv.has_inputs = true;
    }
    return inv;
}

bool is_clang(const std::string& compiler) {
    const auto base = compiler.substr(compiler.rfind('/') + 1);
    return base.find("clang") != std::string::npos;
}

std::string real_compiler(const Invocation& inv) {
    const char* env = std::getenv(kCxx ? "IPROBE_CXX" : "IPROBE_CC");
    if (env && *env) return env;
    if (inv.mode == Mode::llvm) return kCxx ? "clang++-14" : "clang-14";
    return kCxx ? "g++" : "gcc";
}

std::vector<std::string> split_words(const std::string& text) {
    std::vector<std::string> out;
    std::string word;
    for (const char c : text) {
        if (c == ' ' || c == '\t' || c == '\n') {
            if (!word.empty()) out.push_back(std::move(word)), word.clear();
        } else {
            word += c;
        }
    }
    if (!word.empty()) out.push_back(std::move(word));
    return out;
}

std::vector<std::string> finstrument_flags(const std::string& compiler) {
    if (const char* custom = std::getenv("IPROBE_CFLAGS")) return split_words(custom);
    // Without sibling-call optimisation, because a void function's exit hook
    // would otherwise become `jmp __cyg_profile_func_exit`: not a call, so
    // not a placeholder a return-address-keyed handler can serve.
    if (is_clang(compiler)) return {"-finstrument-functions-after-inlining", "-fno-optimize-sibling-calls"};
    std::vector<std::string> flags{"-finstrument-functions", "-fno-optimize-sibling-calls"};
    const char* exclude = std::getenv("IPROBE_EXCLUDE");
    const std::string list = exclude ? exclude : "/usr/include,/usr/lib";
    if (!list.empty()) flags.push_back("-finstrument-functions-exclude-file-list=" + list);
    return flags;
}

#ifndef IPROBE_GCC_PLUGIN_VERSION
#define IPROBE_GCC_PLUGIN_VERSION ""
#endif

// What `compiler -dumpfullversion` prints ("12.2.0"), "" when it cannot run.
std::string compiler_version(const std::string& compiler) {
    int out[2];
    if (::pipe(out) != 0) return {};
    const pid_t pid = ::fork();
    if (pid < 0) {
        ::close(out[0]);
        ::close(out[1]);
        return {};
    }
    if (pid == 0) {
        ::dup2(out[1], STDOUT_FILENO);
        ::close(out[0]);
        ::close(out[1]);
        ::execlp(compiler.c_str(), compiler.c_str(), "-dumpfullversion", static_cast<char*>(nullptr));
        _exit(127);
    }
    ::close(out[1]);
    std::string text;
    char buffer[256];
    for (ssize_t n; (n = ::read(out[0], buffer, sizeof buffer)) != 0;) {
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) break;
        text.append(buffer, static_cast<std::size_t>(n));
    }
    ::close(out[0]);
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? text : std::string{};
}

// The gcc plugin that pads every function without -fpatchable-function-entry
// (gcc-plugin/iprobe_gcc_plugin.cc: the option costs gcc's IPA-RA), when it
// was built for this very gcc; IPROBE_GCC_PLUGIN=0 turns it off, a path
// names another build of it.
std::string gcc_plugin_for(const std::string& compiler) {
    if (is_clang(compiler)) return {};
    if (const char* env = std::getenv("IPROBE_GCC_PLUGIN"); env && *env)
        return std::string_view(env) == "0" ? std::string{} : std::string(env);
    const std::string plugin = (iprobe::InstallLayout::current().lib() / "iprobe" / "iprobe_pad.so").string();
    const std::string_view built_for = IPROBE_GCC_PLUGIN_VERSION;
    if (built_for.empty() || !file_exists(plugin) || compiler_version(compiler) != built_for) return {};
    return plugin;
}

// gcc pads each out-of-line function with 5 single-byte NOPs at its entry
// (after endbr64 under -fcf-protection), none before it (M=0): coldpatch
// merges them into the 5-byte NOP an enabled entry turns into a call (clang
// emits that one NOP itself).  With the plugin every function gets the pad
// as an attribute, and gcc keeps its interprocedural register allocation.
// Small functions stay unpadded below the threshold (the plugin decides; the
// option pads every function).
std::vector<std::string> entry_flags(const std::string& compiler, const std::string& pad_threshold) {
    if (const char* custom = std::getenv("IPROBE_CFLAGS")) return split_words(custom);
    if (const std::string plugin = gcc_plugin_for(compiler); !plugin.empty()) {
        std::vector<std::string> flags{"-fplugin=" + plugin};
        if (!pad_threshold.empty()) flags.push_back("-fplugin-arg-iprobe_pad-pad-threshold=" + pad_threshold);
        return flags;
    }
    return {"-fpatchable-function-entry=5,0"};
}

// Everything the LLVM flow needs from the wrapper lives here (the LLVM area
// may extend it with its filter options).
std::vector<std::string> llvm_flags() {
    std::string plugin;
    if (const char* env = std::getenv("IPROBE_PASS_PLUGIN"); env && *env)
        plugin = env;
    else
        plugin = (iprobe::InstallLayout::current().lib() / "IProbePass.so").string();
    if (!file_exists(plugin))
        throw iprobe::Error("LLVM pass plugin " + plugin +
                                " not found; build target IProbePass or set IPROBE_PASS_PLUGIN",
                            iprobe::ExitCode::unavailable);
    return {"-fpass-plugin=" + plugin, "-Xclang", "-load", "-Xclang", plugin};
}

// Distinct no-op hooks for static links, built beside the wrapper.
std::string static_hooks_object() {
    return (iprobe::InstallLayout::current().lib() / "iprobe" / "iprobe-static-hooks.o").string();
}

// The linker script fragment that keeps gcc's pad records out of entry-flow
// links (entry_records.ld says why), beside the wrapper.
std::string entry_records_script() {
    return (iprobe::InstallLayout::current().lib() / "iprobe" / "iprobe-entry-records.ld").string();
}

// gold cannot read INSERT; every other linker gets the script.
bool links_with_gold(const Invocation& inv) {
    for (const auto& a : inv.args)
        if (a == "-fuse-ld=gold") return true;
    return false;
}

int run_compiler(const std::string& compiler, const std::vector<std::string>& args, bool replace_process) {
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(compiler.c_str()));
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    if (verbose()) {
        std::string line;
        for (char** p = argv.data(); *p; ++p) line += std::string(line.empty() ? "" : " ") + *p;
        note("running " + line);
    }
    if (replace_process) {
        ::execvp(compiler.c_str(), argv.data());
        std::fprintf(stderr, "%s: cannot run %s: %s (set %s to the real compiler)\n", kSelf, compiler.c_str(),
                     std::strerror(errno), kCxx ? "IPROBE_CXX" : "IPROBE_CC");
        return 127;
    }
    const pid_t pid = ::fork();
    if (pid < 0) {
        std::perror("fork");
        return 1;
    }
    if (pid == 0) {
        ::execvp(compiler.c_str(), argv.data());
        std::fprintf(stderr, "%s: cannot run %s: %s (set %s to the real compiler)\n", kSelf, compiler.c_str(),
                     std::strerror(errno), kCxx ? "IPROBE_CXX" : "IPROBE_CC");
        _exit(127);
    }
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return 1;
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    return 128 + WTERMSIG(status);
}

// Functions with neither a pad nor a relocatable entry: no probe, said so
// (gcc's cold parts are no functions of their own, listed by --refused only).
void report_unprobed_functions(const std::string& output, const std::vector<iprobe::probelist::RefusedFunction>& refused) {
    std::size_t count = 0;
    std::string first;
    for (const auto& f : refused) {
        if (f.reason == "cold part") continue;
        if (count++ < 3) first += std::string(first.empty() ? "" : ", ") + f.demangled + " (" + f.reason + ")";
    }
    if (count == 0) return;
    note("warning: " + output + ": " + std::to_string(count) +
         " function(s) have no pad and cannot be relocated, so no probe: " + first + (count > 3 ? ", ..." : "") +
         " (see 'iprobe list " + output + " --refused'; --pad-threshold=0 pads every function iprobe-cc compiles)");
}

int coldpatch_output(const std::string& output) {
    iprobe::coldpatch::ColdpatchOptions options;
    options.allow_no_placeholders = true;
    const auto result = iprobe::coldpatch::coldpatch(output, options);
    if (result.unnamed_pads)
        note("warning: " + output + ": " + std::to_string(result.unnamed_pads) +
             " function(s) have a pad but no symbol (stripped? link without -s and strip later): not probes");
    report_unprobed_functions(output, result.refused);
    if (result.outcome == iprobe::coldpatch::ColdpatchOutcome::no_placeholders ||
        result.outcome == iprobe::coldpatch::ColdpatchOutcome::embedded) {
        if (verbose()) note(output + ": no placeholders (nothing instrumented); left unchanged");
        return 0;
    }
    // Only on a terminal: configure scripts may treat any stderr as failure.
    const char* quiet = std::getenv("IPROBE_CC_QUIET");
    if (verbose() || (::isatty(STDERR_FILENO) && !(quiet && *quiet))) note(iprobe::coldpatch::summary_line(result));
    if (result.hook_tail_jumps)
        note("warning: " + std::to_string(result.hook_tail_jumps) + " tail jump(s) to a hook left in place");
    if (result.foreign_pads && verbose())
        note(output + ": " + std::to_string(result.foreign_pads) + " patchable entries of another form left alone");
    return 0;
}

int wrap(int argc, char** argv) {
    if (argc == 2 && (std::string_view(argv[1]) == "--iprobe-help")) {
        std::printf(kHelp, kSelf, kCxx ? "++" : "");
        return 0;
    }
    // Guard against IPROBE_CC naming this wrapper (it would call itself forever).
    if (std::getenv("IPROBE_CC_ACTIVE")) {
        std::fprintf(stderr, "%s: %s names iprobe's own wrapper; set it to the real compiler (gcc, clang-14)\n",
                     kSelf, kCxx ? "IPROBE_CXX" : "IPROBE_CC");
        return static_cast<int>(iprobe::ExitCode::usage);
    }
    ::setenv("IPROBE_CC_ACTIVE", "1", 1);

    Invocation inv = parse(argc, argv);
    const std::string compiler = real_compiler(inv);
    const bool compiles = inv.has_inputs && !inv.preprocess_only;
    const bool links = inv.has_inputs && !inv.stops_before_link && !inv.relocatable;

    std::vector<std::string> args;
    if (compiles) {
        const auto extra = inv.mode == Mode::llvm    ? llvm_flags()
                           : inv.mode == Mode::entry ? entry_flags(compiler, inv.pad_threshold)
                                                     : finstrument_flags(compiler);
        args.insert(args.end(), extra.begin(), extra.end());
    }
    args.insert(args.end(), inv.args.begin(), inv.args.end());
    const char* coldpatch_env = std::getenv("IPROBE_COLDPATCH");
    const bool coldpatch_wanted = !(coldpatch_env && std::string_view(coldpatch_env) == "0");
    const bool coldpatch_after = links && inv.mode != Mode::llvm && inv.output != "-" && coldpatch_wanted;
    if (coldpatch_after && inv.mode == Mode::finstrument && inv.is_static && file_exists(static_hooks_object()))
        args.push_back(static_hooks_object());
    if (links && inv.mode == Mode::entry && !links_with_gold(inv)) {
        if (!file_exists(entry_records_script()))
            throw iprobe::Error(entry_records_script() + " not found; build target iprobe-cc or reinstall",
                                iprobe::ExitCode::unavailable);
        args.push_back("-Wl,-T," + entry_records_script());
    }
    if (!coldpatch_after) return run_compiler(compiler, args, true);

    const int status = run_compiler(compiler, args, false);
    if (status != 0) return status;
    return coldpatch_output(inv.output.empty() ? "a.out" : inv.output);
}

}  // namespace

int main(int argc, char** argv) {
    return iprobe::run_reporting_errors(kSelf, [&] { return wrap(argc, argv); });
}
