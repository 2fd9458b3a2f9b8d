#include "clone_patches.h"

#include <sys/stat.h>

#include <filesystem>

#include "iprobe/hotpatch/output.h"
#include "iprobe/support/error.h"

namespace fs = std::filesystem;

namespace iprobe::launcher {

namespace {

// A reply as one readable line: CR LF shown, long ones cut.
std::string one_line(const std::string& s, std::size_t max = 120) {
    std::string out;
    for (char c : s.substr(0, max)) {
        if (c == '\r') out += "\\r";
        else if (c == '\n') out += "\\n";
        else if (static_cast<unsigned char>(c) < 0x20) out += '.';
        else out += c;
    }
    return s.size() > max ? out + "..." : out;
}

}  // namespace

std::vector<hotpatch::FunctionPatch> patch_requests(const std::vector<std::string>& specs) {
    std::vector<hotpatch::FunctionPatch> out;
    for (const std::string& spec : specs) {
        const auto eq = spec.find('=');
        if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size())
            throw Error("--patch wants F=LIB.so[:SYMBOL], not '" + spec + "'", ExitCode::usage);
        std::string with = spec.substr(eq + 1);
        const auto slash = with.rfind('/');
        const auto colon = with.find(':', slash == std::string::npos ? 0 : slash);
        const std::string library = with.substr(0, colon);
        std::error_code ec;
        const fs::path absolute = fs::absolute(library, ec);
        struct stat st {};
        if (ec || ::stat(absolute.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
            throw Error("--patch " + spec + ": replacement library " + library + " not found", ExitCode::not_found);
        out.push_back({spec.substr(0, eq), absolute.string(),
                       colon == std::string::npos ? std::string() : with.substr(colon + 1)});
    }
    return out;
}

void patch_clone(const SessionEvents& say, CloneProbes& agent, const std::string& label,
                 const std::vector<hotpatch::FunctionPatch>& patches) {
    const hotpatch::PatchStats st = agent.patch(patches);
    std::string human;
    for (const auto& f : st.patched)
        human += (human.empty() ? "" : ", ") + hotpatch::describe_patched(f) + " (signature " + f.signature_check + ")";
    say("patched",
        "patched in " + label + " (PID " + std::to_string(agent.host_pid()) + ") only: " + human + "; " +
            std::to_string(st.threads) + " threads stopped for " + std::to_string(st.pause_us) + " us",
        [&](JsonWriter& w) {
            w.field("clone_pid", static_cast<std::int64_t>(agent.host_pid()));
            // As `iprobe patch --json` reports it.
            w.key("patch").begin_object().key("patched").begin_array();
            for (const auto& f : st.patched) hotpatch::write_patched(w, f);
            w.end_array().key("injected").begin_array();
            for (const auto& lib : st.injected) w.value(lib);
            w.end_array();
            w.field("threads", static_cast<std::uint64_t>(st.threads)).field("pause_us", st.pause_us);
            w.field("stop_us", st.stop_us).end_object();
        });
}

std::size_t say_changes(const SessionEvents& say, const proxy::DivergenceStats& d, std::size_t from, const char* copy) {
    for (std::size_t i = from; i < d.reports.size(); i++) {
        const auto& r = d.reports[i];
        say("changed",
            "changed reply " + std::to_string(r.index) + " of connection " + std::to_string(r.connection) + " to '" +
                one_line(r.request) + "': production " + one_line(r.production) + ", " + copy + " " + one_line(r.debug),
            [&](JsonWriter& w) {
                w.field("connection", r.connection).field("reply_index", r.index).field("request", r.request);
                w.field("production", r.production).field("patched", r.debug);
            });
    }
    return d.reports.size();
}

void say_patch_effect(const SessionEvents& say, const proxy::DivergenceStats& d) {
    // Byte for byte (stream) a connection's comparison ends at its first
    // difference, and `compared` counts bytes, not replies.
    std::string human =
        d.mode == "stream"
            ? "the patch changed the replies of " + std::to_string(d.diverged_connections) +
                  " connections (compared byte for byte: " + std::to_string(d.compared) + " bytes equal; " +
                  std::to_string(d.unchecked_connections) + " connections not comparable)"
            : "the patch changed " + std::to_string(d.mismatches) + " of " + std::to_string(d.compared) +
                  " replies compared (" + std::to_string(d.diverged_connections) + " connections; " +
                  std::to_string(d.ignored) + " not compared by rule, " + std::to_string(d.unchecked_connections) +
                  " connections not comparable)";
    if (d.mismatches > d.reports.size())
        human += "; the first " + std::to_string(d.reports.size()) + " are listed (\"changed\")";
    say("patch-effect", human, [&](JsonWriter& w) {
        w.field("mode", d.mode).field("compared", d.compared).field("changed", d.mismatches);
        w.field("changed_connections", d.diverged_connections);
        w.field("ignored", d.ignored).field("unchecked_connections", d.unchecked_connections);
        w.field("listed", static_cast<std::uint64_t>(d.reports.size()));
        w.key("changes").begin_array();
        for (const auto& r : d.reports) {
            w.begin_object().field("connection", r.connection).field("reply_index", r.index).field("request", r.request);
            w.field("production", r.production).field("patched", r.debug).end_object();
        }
        w.end_array();
    });
}

}  // namespace iprobe::launcher
