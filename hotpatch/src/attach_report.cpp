#include "iprobe/hotpatch/attach_report.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "iprobe/formats/rt_layout.h"

#include "iprobe/support/error.h"
#include "iprobe/support/json.h"

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
    if (st.values_unavailable)
        out += "\n" + std::to_string(st.values_unavailable) +
               " selected probe(s) record no values: not function-entry sites (the -finstrument-functions flow); "
               "build with the entry or LLVM flow";
    if (st.values_untyped)
        out += "\n" + std::to_string(st.values_untyped) +
               " function(s) without DWARF: arguments recorded as arg0..arg5, raw (build with -g, or install the "
               "debug file)";
    return out;
}

std::string attach_json(const AttachStats& st, pid_t pid) {
    JsonWriter j;
    j.begin_object()
        .field("pid", static_cast<std::int64_t>(pid))
        .field("selected", static_cast<std::uint64_t>(st.selected))
        .field("enabled", static_cast<std::uint64_t>(st.enabled))
        .field("already_enabled", static_cast<std::uint64_t>(st.already_enabled))
        .field("total_enabled", static_cast<std::uint64_t>(st.total_enabled))
        .field("threads", static_cast<std::uint64_t>(st.threads))
        .field("pause_us", st.pause_us)
        .field("stop_us", st.stop_us)
        .field("runtime_injected", st.runtime_injected)
        .field("refused", static_cast<std::uint64_t>(st.refused))
        .field("exits_left_off", static_cast<std::uint64_t>(st.exits_left_off))
        .field("values_unavailable", static_cast<std::uint64_t>(st.values_unavailable))
        .field("values_untyped", static_cast<std::uint64_t>(st.values_untyped))
        .key("patched_skipped")
        .begin_array();
    for (const auto& f : st.patched_skipped) j.value(f);
    j.end_array().end_object();
    return j.str();
}

AttachStats parse_attach_json(std::string_view text) {
    try {
        const auto doc = nlohmann::json::parse(text);
        AttachStats st;
        doc.at("selected").get_to(st.selected);
        doc.at("enabled").get_to(st.enabled);
        doc.at("already_enabled").get_to(st.already_enabled);
        doc.at("total_enabled").get_to(st.total_enabled);
        doc.at("threads").get_to(st.threads);
        doc.at("pause_us").get_to(st.pause_us);
        doc.at("stop_us").get_to(st.stop_us);
        doc.at("runtime_injected").get_to(st.runtime_injected);
        if (doc.contains("refused")) doc.at("refused").get_to(st.refused);
        if (doc.contains("exits_left_off")) doc.at("exits_left_off").get_to(st.exits_left_off);
        if (doc.contains("values_unavailable")) doc.at("values_unavailable").get_to(st.values_unavailable);
        if (doc.contains("values_untyped")) doc.at("values_untyped").get_to(st.values_untyped);
        if (doc.contains("patched_skipped")) doc.at("patched_skipped").get_to(st.patched_skipped);
        return st;
    } catch (const nlohmann::json::exception& e) {
        throw Error(std::string("not an attach report: ") + e.what(), ExitCode::bad_input);
    }
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

std::vector<std::string> value_option_args(const ValueOptions& values) {
    std::vector<std::string> out;
    if (values.args) out.push_back("--args");
    if (values.retval) out.push_back("--retval");
    if (values.backtrace) out.push_back("--backtrace=" + std::to_string(values.backtrace));
    return out;
}

}  // namespace iprobe::hotpatch
