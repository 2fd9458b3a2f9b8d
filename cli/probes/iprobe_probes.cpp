// `iprobe coldpatch` and `iprobe list`: the build-time half of iprobe.
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "iprobe/coldpatch/coldpatch.h"
#include "iprobe/probelist/probe_source.h"
#include "iprobe/support/args.h"
#include "iprobe/support/error.h"
#include "iprobe/support/glob.h"
#include "iprobe/support/json.h"

namespace {

using iprobe::Error;
using iprobe::ExitCode;
using iprobe::ArgSpec;
using iprobe::ParsedArgs;

const ArgSpec kColdpatchSpec(
    "iprobe coldpatch", "usage: iprobe coldpatch FILE [-o OUT] [--probes PATH] [--json] [-q]",
    "Turns every call to __cyg_profile_func_enter/exit in FILE (an x86-64\n"
    "executable or shared library built with -finstrument-functions, e.g. by\n"
    "iprobe-cc) into a NOP of the same length, and writes the probe list to\n"
    "FILE.probes.  A binary built with -fpatchable-function-entry=5,0 (iprobe-cc\n"
    "--flow=entry) has the five 1-byte NOPs at each function's entry merged into one\n"
    "5-byte NOP instead, one entry probe per function.  Both files are replaced\n"
    "atomically; on any error neither changes.",
    {
        {"--output", "OUT", "write the patched binary to OUT (FILE stays as it is)", "-o"},
        {"--probes", "PATH", "write the probe list to PATH (default: <binary>.probes)"},
        {"--json", "", "print the result as JSON"},
        {"--quiet", "", "no summary line", "-q"},
    },
    "Running it again on a coldpatched binary is harmless: when FILE.probes names\n"
    "the same build-id and every site already holds its NOP, it prints\n"
    "'already coldpatched; nothing to do' and exits 0.\n"
    "\n"
    "exit codes: 0 ok, 2 usage, 3 bad input (not ELF, truncated/corrupt, not x86-64,\n"
    "no placeholders), 5 no such file, 1 other failure");

const ArgSpec kListSpec(
    "iprobe list",
    "usage: iprobe list FILE|FILE.probes [--functions GLOB]... [--file GLOB]...\n"
    "                   [--kind entry,exit,point] [--refused] [--json] [--count]",
    "Shows the probes of a probe list, of a coldpatched binary (its FILE.probes)\n"
    "or of a binary carrying an embedded probe section (LLVM flow).  Any other\n"
    "x86-64 binary (nobody prepared it: no iprobe-cc) gets one entry and one exit\n"
    "probe per function symbol with a size (.symtab, else .dynsym) whose first\n"
    "instructions can be relocated (flow 'unprepared'); the summary says how many\n"
    "functions are probe-able and why the others are not (--refused lists them).\n"
    "An entry-flow binary's functions iprobe-cc left without a pad (small ones,\n"
    "under its --pad-threshold) are such relocated entries too (KIND entry*): the summary\n"
    "counts padded and relocated ones and the refused, with their reasons.",
    {
        {"--functions", "GLOB[,GLOB]", "only functions matching a GLOB (demangled or raw); repeatable", "-f"},
        {"--file", "GLOB", "only probes whose source path or its basename match; repeatable"},
        {"--kind", "K[,K]", "only these kinds: entry, exit, point", "-k"},
        {"--count", "", "print only the number of matching probes"},
        {"--refused", "", "the functions that got no probe (unprepared binary, or the entry flow's unpadded ones), each with its reason"},
        {"--json", "", "machine-readable output (all fields)"},
    },
    "exit codes: 0 ok, 2 usage, 3 bad input, 5 not found");

// The one FILE both commands take.
std::string file_argument(const ArgSpec& spec, const ParsedArgs& a) {
    if (a.positionals().empty()) spec.fail("missing FILE");
    if (a.positionals().size() > 1) spec.fail("one FILE at a time");
    return a.positionals().front();
}

std::string hex_address(std::uint64_t a) {
    char buf[24];
    std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(a));
    return buf;
}

void write_list_header_json(iprobe::JsonWriter& j, const iprobe::probelist::ProbeList& list) {
    j.field("module", list.module);
    j.field("build_id", list.build_id_hex());
    j.field("flow", iprobe::probelist::flow_name(list.flow));
    j.key("flags").begin_array();
    if (list.flags & IPROBE_PL_FLAG_PIE) j.value("pie");
    if (list.flags & IPROBE_PL_FLAG_SHARED) j.value("shared");
    if (list.flags & IPROBE_PL_FLAG_DWARF) j.value("dwarf");
    j.end_array();
    j.field("enter_target", list.enter_target);
    j.field("exit_target", list.exit_target);
    j.field("enter_got_slot", list.enter_got_slot);
    j.field("exit_got_slot", list.exit_got_slot);
}

// Unprepared binary, or an entry-flow one with functions without a pad: how
// many function symbols are probe-able (how many relocated), and why not
// the others.
struct Refusals {
    std::size_t functions = 0, probeable = 0, relocated = 0;
    std::map<std::string, std::size_t> by_reason;
};

bool lists_functions(const iprobe::probelist::ProbeList& list) {
    return list.flow == IPROBE_FLOW_UNPREPARED || list.has_relocated() || !list.refused.empty();
}

Refusals refusals_of(const iprobe::probelist::ProbeList& list) {
    Refusals r;
    for (const auto& p : list.probes) {
        r.probeable += p.kind == iprobe::probelist::ProbeKind::entry;
        r.relocated += p.relocated;
    }
    for (const auto& f : list.refused) r.by_reason[f.reason]++;
    r.functions = r.probeable + list.refused.size();
    return r;
}

void write_refusals_json(iprobe::JsonWriter& j, const iprobe::probelist::ProbeList& list, bool each) {
    const Refusals r = refusals_of(list);
    j.field("functions", static_cast<std::uint64_t>(r.functions));
    j.field("probeable", static_cast<std::uint64_t>(r.probeable));
    j.field("relocated", static_cast<std::uint64_t>(r.relocated));
    j.key("refused_by_reason").begin_object();
    for (const auto& [reason, n] : r.by_reason) j.field(reason, static_cast<std::uint64_t>(n));
    j.end_object();
    if (!each) return;
    j.key("refused").begin_array();
    for (const auto& f : list.refused) {
        j.begin_object();
        j.field("function", f.function);
        j.field("demangled", f.demangled);
        j.field("address", f.address);
        j.field("size", f.size);
        j.field("reason", f.reason);
        j.field("detail", f.detail);
        j.end_object();
    }
    j.end_array();
}

void print_refusals(const iprobe::probelist::ProbeList& list, bool each, const iprobe::probelist::ProbeSelector& selector) {
    const Refusals r = refusals_of(list);
    std::printf("# %zu of %zu functions probe-able (%.1f%%", r.probeable, r.functions,
                r.functions ? 100.0 * static_cast<double>(r.probeable) / static_cast<double>(r.functions) : 0.0);
    if (list.flow != IPROBE_FLOW_UNPREPARED)
        std::printf("; %zu padded, %zu relocated", r.probeable - r.relocated, r.relocated);
    std::printf(")");
    const char* sep = "; refused: ";
    for (const auto& [reason, n] : r.by_reason) {
        std::printf("%s%zu %s", sep, n, reason.c_str());
        sep = ", ";
    }
    std::printf("\n");
    if (!each) return;
    std::printf("%-18s %-40s %-26s %s\n", "ADDRESS", "FUNCTION", "REASON", "DETAIL");
    for (const auto& f : list.refused) {
        iprobe::probelist::Probe as_probe;
        as_probe.function = f.function;
        as_probe.demangled = f.demangled;
        if (!selector.function_globs.empty() && !selector.matches(as_probe)) continue;
        std::printf("%-18s %-40s %-26s %s\n", hex_address(f.address).c_str(), f.demangled.c_str(), f.reason.c_str(),
                    f.detail.c_str());
    }
}

void write_probe_json(iprobe::JsonWriter& j, const iprobe::probelist::Probe& p) {
    j.begin_object();
    j.field("id", p.id);
    j.field("kind", iprobe::probelist::to_string(p.kind));
    j.field("form", std::string(iprobe::probelist::to_string(p.form)));
    j.field("size", static_cast<unsigned>(p.size));
    j.field("site", p.site);
    j.field("function_address", p.function_address);
    j.field("shared_site", p.shared_site);
    j.field("relocated_entry", p.relocated);
    j.field("function", p.function);
    j.field("demangled", p.demangled);
    j.field("file", p.file);
    j.field("line", p.line);
    j.field("original", iprobe::probelist::hex(std::span(p.original.data(), p.size)));
    j.field("placeholder", iprobe::probelist::hex(std::span(p.placeholder.data(), p.size)));
    if (!p.moved.empty()) j.field("relocated", iprobe::probelist::hex(p.moved));
    j.end_object();
}

int run_coldpatch(int argc, char** argv) {
    const auto parsed = kColdpatchSpec.parse_or_print_help(argc, argv, 2);
    if (!parsed) return 0;
    const ParsedArgs& a = *parsed;
    const std::string file = file_argument(kColdpatchSpec, a);
    iprobe::coldpatch::ColdpatchOptions options;
    options.output = a.value("--output");
    options.probes_path = a.value("--probes");
    const bool json = a.has("--json"), quiet = a.has("--quiet");
    const auto result = iprobe::coldpatch::coldpatch(file, options);
    if (json) {
        iprobe::JsonWriter j;
        j.begin_object();
        j.field("binary", result.binary_path);
        j.field("probes_file", result.probes_path);
        j.field("outcome", result.outcome == iprobe::coldpatch::ColdpatchOutcome::patched           ? "patched"
                           : result.outcome == iprobe::coldpatch::ColdpatchOutcome::already_patched ? "already_patched"
                                                                                         : "embedded");
        j.field("probes", static_cast<std::uint64_t>(result.list.probes.size()));
        j.field("entry", static_cast<std::uint64_t>(result.entries));
        j.field("exit", static_cast<std::uint64_t>(result.exits));
        j.field("point", static_cast<std::uint64_t>(result.points));
        j.field("hook_tail_jumps_left", static_cast<std::uint64_t>(result.hook_tail_jumps));
        j.field("build_id", result.list.build_id_hex());
        j.field("elapsed_ms", result.elapsed_ms);
        j.end_object();
        std::printf("%s\n", j.str().c_str());
    } else if (!quiet) {
        std::printf("%s\n", iprobe::coldpatch::summary_line(result).c_str());
    }
    if (result.hook_tail_jumps)
        std::fprintf(stderr,
                     "iprobe coldpatch: warning: %zu tail jump(s) to a hook left in place (not a call; "
                     "they still run glibc's no-op hook)\n",
                     result.hook_tail_jumps);
    if (result.kinds_inferred)
        std::fprintf(stderr,
                     "iprobe coldpatch: note: the enter and exit hooks share one address (a static link with "
                     "glibc's aliased hooks); entry/exit of %zu probes inferred from code order. Link with "
                     "iprobe-cc to get exact kinds\n",
                     result.kinds_inferred);
    return 0;
}

int run_list(int argc, char** argv) {
    const auto parsed = kListSpec.parse_or_print_help(argc, argv, 2);
    if (!parsed) return 0;
    const ParsedArgs& a = *parsed;
    const std::string file = file_argument(kListSpec, a);
    iprobe::probelist::ProbeSelector selector;
    for (const auto& list : a.values("--functions"))
        for (auto& g : iprobe::split_list(list)) selector.function_globs.push_back(std::move(g));
    for (const auto& list : a.values("--file"))
        for (auto& g : iprobe::split_list(list)) selector.file_globs.push_back(std::move(g));
    for (const auto& list : a.values("--kind"))
        for (const auto& k : iprobe::split_list(list)) selector.kinds.push_back(iprobe::probelist::parse_probe_kind(k));
    const bool json = a.has("--json"), count_only = a.has("--count"), refused = a.has("--refused");
    const iprobe::probelist::ProbeList list = iprobe::probelist::load_probes_or_symbols(file);
    const bool functions = lists_functions(list);
    const auto selected = selector.select(list);
    if (json) {
        iprobe::JsonWriter j;
        j.begin_object();
        write_list_header_json(j, list);
        j.field("total", static_cast<std::uint64_t>(list.probes.size()));
        j.field("selected", static_cast<std::uint64_t>(selected.size()));
        if (functions) write_refusals_json(j, list, refused && !count_only);
        if (!count_only) {
            j.key("probes").begin_array();
            for (const auto* p : selected) write_probe_json(j, *p);
            j.end_array();
        }
        j.end_object();
        std::printf("%s\n", j.str().c_str());
        return 0;
    }
    if (count_only) {
        std::printf("%zu\n", selected.size());
        return 0;
    }
    std::printf("# module %s  build-id %s  flow %s  %zu of %zu probes\n", list.module.c_str(),
                list.build_id.empty() ? "(none)" : list.build_id_hex().c_str(),
                std::string(iprobe::probelist::flow_name(list.flow)).c_str(), selected.size(), list.probes.size());
    if (functions) print_refusals(list, refused, selector);
    if (refused) return 0;
    if (list.has_relocated() && list.flow != IPROBE_FLOW_UNPREPARED)
        std::printf("# entry*: no pad, relocated when enabled\n");
    std::printf("%-6s %-6s %-18s %-40s %s\n", "ID", "KIND", "ADDRESS", "FUNCTION", "SOURCE");
    std::string line;
    for (const auto* p : selected) {
        std::string source = p->file.empty() ? "-" : p->file + ":" + std::to_string(p->line);
        // A relocated entry of a padded binary is marked: the exception there.
        const std::string kind = std::string(iprobe::probelist::to_string(p->kind)) +
                                 (p->relocated && list.flow != IPROBE_FLOW_UNPREPARED ? "*" : "");
        std::printf("%-6u %-6s %-18s %-40s %s\n", p->id, kind.c_str(), hex_address(p->site).c_str(),
                    p->demangled.c_str(), source.c_str());
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    const char* command = argc > 1 ? argv[1] : "";
    return iprobe::run_reporting_errors(std::string("iprobe ") + command, [&] {
        if (std::strcmp(command, "coldpatch") == 0) return run_coldpatch(argc, argv);
        if (std::strcmp(command, "list") == 0) return run_list(argc, argv);
        std::fprintf(stderr, "iprobe-probes: run as 'iprobe coldpatch' or 'iprobe list'\n");
        return static_cast<int>(ExitCode::usage);
    });
}
