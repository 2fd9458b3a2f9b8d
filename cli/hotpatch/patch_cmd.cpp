// `iprobe patch`: replace functions of a running process, put them back
// (live_patch.h).
#include "patch_cmd.h"

#include <iostream>

#include "iprobe/hotpatch/live_patch.h"
#include "iprobe/hotpatch/output.h"
#include "iprobe/support/args.h"
#include "iprobe/support/error.h"
#include "iprobe/support/glob.h"
#include "iprobe/support/json.h"
#include "iprobe/support/number.h"

namespace iprobe::hotpatch {

namespace {

constexpr const char* kSynopsis =
    "usage: iprobe patch PID --function F --with LIB.so[:SYMBOL] [--function F --with LIB.so[:SYMBOL]…]\n"
    "                    [--probes LIST,…] [--force] [--json]\n"
    "       iprobe patch PID --revert [F…] [--json]";

constexpr const char* kAbout =
    "Replaces function F of a running process, built with iprobe-cc (entry or LLVM flow), by\n"
    "SYMBOL of LIB.so (default: F's own name): LIB.so is loaded into the process (dlopen, as\n"
    "attach loads the runtime) and F's entry NOP becomes a jump to SYMBOL, with every thread\n"
    "stopped for a moment. Threads already inside F finish in the old code; every new call\n"
    "runs the replacement. Before anything is written: SYMBOL must exist, F and SYMBOL must\n"
    "have the same signature where both have DWARF (-g) (--force overrides), F must not be\n"
    "a function the iprobe runtime calls, and F's probes must be off.\n"
    "--revert puts the entries of F… (default: every patched function) back; the replacement\n"
    "stays loaded, so a thread still inside it finishes there.\n"
    "F is a name as 'iprobe list' shows it (a C++ one may leave out its parameters); SYMBOL\n"
    "is the raw (mangled) name. 'iprobe status PID' lists what is patched and with what.\n"
    "The replacement is a function like any other: probe it with\n"
    "'iprobe attach PID --probes LIB.so --functions SYMBOL'. Try a fix on production's live\n"
    "traffic in a clone first: 'iprobe debug … --patch F=LIB.so' (docs/active-debugging.md).";

constexpr const char* kFooter =
    "exit codes: 0 ok, 1 failed, 2 usage, 3 bad input (signatures differ, not a patchable entry),\n"
    "            4 permission, 5 not found (function, library, symbol), 6 busy (probes on, another\n"
    "            session), 7 unavailable";

ArgSpec patch_spec() {
    return ArgSpec("iprobe patch", kSynopsis, kAbout,
                   {
                       {"--function", "F", "the function to replace (repeatable, each with its --with)"},
                       {"--with", "LIB.so[:SYMBOL]", "its replacement: a shared object and the function in it"},
                       {"--probes", "LIST,...", "modules (binaries, libraries, probe lists) where F is looked for\n"
                                              "(default: every module of the process with a probe list)"},
                       {"--force", "", "patch even when the signatures differ"},
                       {"--revert", "", "put the entries back (the functions named after it, or all)"},
                       {"--json", "", "machine-readable output"},
                   },
                   kFooter);
}

// {"pid":…,KEY:[functions],["injected":[…],]"threads":…,"pause_us":…,"stop_us":…}
std::string report_json(pid_t pid, const char* key, const std::vector<PatchedFunction>& functions,
                        const std::vector<std::string>* injected, std::size_t threads, std::uint64_t pause_us,
                        std::uint64_t stop_us) {
    JsonWriter j;
    j.begin_object().field("pid", static_cast<std::int64_t>(pid)).key(key).begin_array();
    for (const auto& f : functions) write_patched(j, f);
    j.end_array();
    if (injected) {
        j.key("injected").begin_array();
        for (const auto& lib : *injected) j.value(lib);
        j.end_array();
    }
    j.field("threads", static_cast<std::uint64_t>(threads)).field("pause_us", pause_us).field("stop_us", stop_us);
    return j.end_object().str();
}

// "LIB.so:SYMBOL": the symbol after the first ':' of the file name part.
FunctionPatch parse_with(const std::string& function, const std::string& with) {
    FunctionPatch p{function, with, {}};
    const auto slash = with.rfind('/');
    const auto colon = with.find(':', slash == std::string::npos ? 0 : slash);
    if (colon != std::string::npos) {
        p.library = with.substr(0, colon);
        p.symbol = with.substr(colon + 1);
        if (p.symbol.empty()) throw Error("--with " + with + ": empty SYMBOL after ':'", ExitCode::usage);
    }
    if (p.library.empty()) throw Error("--with " + with + ": no library", ExitCode::usage);
    return p;
}

}  // namespace

int run_patch(int argc, char** argv) {
    const ArgSpec spec = patch_spec();
    const ParsedArgs parsed = spec.parse(argc, argv, 2);
    if (parsed.help_requested()) {
        std::cout << spec.help();
        return 0;
    }
    if (parsed.positionals().empty()) spec.fail("missing PID");
    const pid_t pid = parse_pid_or_usage(parsed.positionals().front());
    const std::vector<std::string> rest(parsed.positionals().begin() + 1, parsed.positionals().end());
    std::vector<std::string> sources;
    for (const auto& list : parsed.values("--probes"))
        for (auto& s : split_list(list)) sources.push_back(s);
    const bool json = parsed.has("--json");
    if (parsed.has("--revert")) {
        if (parsed.has("--function") || parsed.has("--with") || parsed.has("--force"))
            spec.fail("--revert takes function names, not --function/--with/--force");
        RevertOptions o{pid, rest, sources, {}};
        const RevertStats st = revert(o);
        if (json) {
            std::cout << report_json(pid, "reverted", st.reverted, nullptr, st.threads, st.pause_us, st.stop_us) << "\n";
        } else if (st.reverted.empty()) {
            std::cout << "nothing is patched in process " << pid << "\n";
        } else {
            for (const auto& f : st.reverted) std::cout << "reverted " << describe_patched(f) << "\n";
            std::cout << st.threads << " threads stopped for " << st.pause_us << " us\n";
        }
        return 0;
    }
    if (!rest.empty()) spec.fail("unexpected argument " + rest.front() + " (function names follow --revert only)");
    const auto functions = parsed.values("--function");
    const auto withs = parsed.values("--with");
    if (functions.empty()) spec.fail("give --function F --with LIB.so[:SYMBOL], or --revert");
    if (functions.size() != withs.size())
        spec.fail("each --function needs its --with (" + std::to_string(functions.size()) + " --function, " +
                  std::to_string(withs.size()) + " --with)");
    PatchOptions o;
    o.pid = pid;
    o.probe_sources = sources;
    o.force = parsed.has("--force");
    for (std::size_t i = 0; i < functions.size(); i++) o.patches.push_back(parse_with(functions[i], withs[i]));
    const PatchStats st = patch(o);
    if (json) {
        std::cout << report_json(pid, "patched", st.patched, &st.injected, st.threads, st.pause_us, st.stop_us) << "\n";
        return 0;
    }
    for (const auto& f : st.patched) {
        std::cout << "patched " << describe_patched(f);
        if (f.signature_check == "match") std::cout << "; signature " << f.signature << " matches";
        else if (f.signature_check == "forced") std::cout << "; signatures differ (--force)";
        else std::cout << "; signature not checked (no DWARF for one of them; build both with -g)";
        std::cout << "\n";
    }
    for (const auto& lib : st.injected) std::cout << "loaded " << lib << "\n";
    std::cout << st.threads << " threads stopped for " << st.pause_us << " us\n";
    return 0;
}

}  // namespace iprobe::hotpatch
