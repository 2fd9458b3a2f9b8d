#include "iprobe/hotpatch/attach_report.h"


namespace iprobe::hotpatch {

std::string attach_summary(const AttachStats& st, std::optional<pid_t> pid) {
    std::string out = "enabled " + std::to_string(st.enabled) + " probes";
    if (pid) out += " in process " + std::to_string(*pid);
    out += " (" + std::to_string(st.already_enabled) + " already on, " + std::to_string(st.total_enabled) +
           " on in total); " + std::to_string(st.threads) + " threads stopped for " + std::to_string(st.pause_us) +
           " us";
    if (st.runtime_injected) out += "; runtime injected";
    if (st.exits_left_off)
        out += "; " + std::to_string(st.exits_left_off) +
               " exit probes left off (the count handler counts calls from entries; --completed counts completed calls too)";
    if (st.refused)
        out += "\n" + std::to_string(st.refused) + " matching function(s) cannot be probed (" + st.refused_example +
               (st.refused > 1 ? ", ..." : "") + "): see 'iprobe list FILE --refused'";
    if (!st.patched_skipped.empty()) {
        out += "; skipped " + std::to_string(st.patched_skipped.size()) +
               " functions replaced by 'iprobe patch' (probe their replacement instead):";
        for (const auto& f : st.patched_skipped) out += " " + f;
    }
    return out;
}

}  // namespace iprobe::hotpatch
