#include "iprobe/hotpatch/attach_report.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>

#include "iprobe/formats/rt_layout.h"
#include "iprobe/support/error.h"

namespace iprobe::hotpatch {

std::string attach_summary(const AttachStats& st, std::optional<pid_t> pid) {
    std::string out = "enabled " + std::to_string(st.enabled) + " probes";
    if (pid) out += " in process " + std::to_string(*pid);
    out += " (" + std::to_string(st.already_enabled) + " already on, " + std::to_string(st.total_enabled) +
           " on in total); " + std::to_string(st.threads) + " threads stopped for ";
    // Two stops: each pause, the runtime's first (the sites planned between).
    if (st.prepare_pause_us)
        out += std::to_string(st.prepare_pause_us) + " us to load the runtime and map its areas, then " +
               std::to_string(st.write_pause_us) + " us to write the sites planned while it ran";
    else
        out += std::to_string(st.pause_us) + " us";
    if (st.runtime_injected) out += "; runtime injected";
    if (st.inherited_sites_restored)
        out += "; first put back the " + std::to_string(st.inherited_sites_restored) +
               " probe sites it ran from the probed process it was forked from";
    if (st.exits_left_off)
        out += "; " + std::to_string(st.exits_left_off) +
               " exit probes left off (the count handler counts calls from entries; --completed counts completed calls too)";
    if (st.exits_runtime_reads)
        out += "\n" + std::to_string(st.exits_runtime_reads) +
               " exit probes left off: the runtime in it (V8, HotSpot) reads the return address of a function its "
               "generated code calls, and a hooked one would kill it; those calls are counted and traced from their "
               "entries";
    if (st.exits_return_twice)
        out += "\n" + std::to_string(st.exits_return_twice) +
               " exit probes left off: their function returns twice or on another stack (setjmp, vfork, swapcontext "
               "and their kin), where a hooked return would be taken again; those calls are counted and traced from "
               "their entries";
    if (st.geometry_kept)
        out += "\nthe process's iprobe region was made by an earlier attach, with rings of " +
               std::to_string(st.ring_records) + " records and " + std::to_string(st.thread_slots) +
               " thread slots, and stays so for the process's life: --buffer, --ring-records and --max-threads "
               "apply to its first attach (or start it under 'iprobe run' with them)";
    if (st.refused)
        out += "\n" + std::to_string(st.refused) + " matching function(s) cannot be probed (" + st.refused_example +
               (st.refused > 1 ? ", ..." : "") + "): see 'iprobe list FILE --refused'";
    if (!st.patched_skipped.empty()) {
        out += "; skipped " + std::to_string(st.patched_skipped.size()) +
               " functions replaced by 'iprobe patch' (probe their replacement instead):";
        for (const auto& f : st.patched_skipped) out += " " + f;
    }
    // A count, on its own line, with what it means (none: nothing said).
    auto counted = [&](std::size_t n, const char* meaning) {
        if (n) out += "\n" + std::to_string(n) + meaning;
    };
    counted(st.values_unavailable,
            " selected probe(s) record no values: developer points, or in the -finstrument-functions flow a function "
            "without DWARF (its site is after the prologue: raw arg0..arg5 cannot be had there; build with -g), a hook "
            "the DWARF places in no function, or an exit whose return its entry cannot hook");
    counted(st.values_optimized_out,
            " parameter(s) shown as <optimized out>: not where the runtime can read them at the -finstrument-functions "
            "site (the entry or LLVM flow has every argument)");
    counted(st.values_no_return,
            " exit hook(s) of inlined copies record no return value: an inlined copy does not return (its result stays "
            "in its caller's code); their calls, arguments and durations are recorded");
    counted(st.when_undecidable,
            " inlined cop(ies) cannot decide the --when: a parameter it names is optimized out at their hook; their "
            "calls are counted (calls), none recorded (matched counts the others)");
    counted(st.values_untyped,
            " function(s) without DWARF: arguments recorded as arg0..arg5, raw (build with -g, or install the debug "
            "file)");
    return out;
}

ValueOptions value_options_of(bool args, bool retval, bool backtrace, const std::string& depth) {
    ValueOptions v;
    v.args = args;
    v.retval = retval;
    if (backtrace) {
        v.backtrace = 8;
        if (!depth.empty()) {
            char* end = nullptr;
            errno = 0;
            const unsigned long n = std::strtoul(depth.c_str(), &end, 10);
            if (errno || *end || !std::isdigit(static_cast<unsigned char>(depth[0])) || n < 1 ||
                n > IPROBE_RT_BACKTRACE_MAX)
                throw Error("--backtrace=DEPTH wants 1 to " + std::to_string(IPROBE_RT_BACKTRACE_MAX) + ", not '" +
                                depth + "'",
                            ExitCode::usage);
            v.backtrace = static_cast<unsigned>(n);
        }
    }
    return v;
}

}  // namespace iprobe::hotpatch
