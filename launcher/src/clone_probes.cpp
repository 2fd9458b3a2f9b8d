#include "clone_probes.h"

#include <map>
#include <set>

#include "iprobe/probelist/probe_source.h"
#include "iprobe/support/error.h"
#include "process.h"

namespace iprobe::launcher {
namespace {

std::string joined(const std::vector<std::string>& items) {
    std::string out;
    for (const auto& i : items) out += (out.empty() ? "" : ",") + i;
    return out;
}

std::string trimmed(std::string s) {
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    return s;
}

}  // namespace

std::vector<std::string> selected_functions(const std::vector<std::string>& sources,
                                            const std::vector<std::string>& function_globs) {
    probelist::ProbeSelector selector;
    selector.function_globs = function_globs;
    std::vector<std::string> out;
    std::set<std::string> seen;
    for (const auto& source : sources) {
        const probelist::ProbeList list = probelist::load_probes(source);
        for (const probelist::Probe* p : selector.select(list))
            if (p->kind != probelist::ProbeKind::point && seen.insert(p->function).second) out.push_back(p->function);
    }
    return out;
}

CloneProbes::CloneProbes(std::string hotpatch_tool, std::vector<std::string> in_clone, pid_t pid_in_clone,
                         pid_t host_pid, std::vector<std::string> probe_sources, hotpatch::ValueOptions values)
    : hotpatch_tool_(std::move(hotpatch_tool)),
      in_clone_(std::move(in_clone)),
      pid_in_clone_(pid_in_clone),
      host_pid_(host_pid),
      probe_sources_(std::move(probe_sources)),
      values_(values) {}

std::vector<std::string> CloneProbes::tool(const std::vector<std::string>& args) const {
    std::vector<std::string> argv = in_clone_;
    argv.push_back(hotpatch_tool_);
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
}

hotpatch::AttachStats CloneProbes::attach(const std::vector<std::string>& functions) {
    std::vector<std::string> args = {"attach", std::to_string(pid_in_clone_), "--json"};
    if (!probe_sources_.empty()) args.insert(args.end(), {"--probes", joined(probe_sources_)});
    if (!functions.empty()) args.insert(args.end(), {"--functions", joined(functions)});
    for (auto& option : hotpatch::value_option_args(values_)) args.push_back(std::move(option));
    const RunResult r = run(tool(args));
    if (!r.ok())
        throw Error("iprobe attach in the clone (PID " + std::to_string(host_pid_) + ") failed: " + trimmed(r.err));
    return hotpatch::parse_attach_json(r.out);
}

void CloneProbes::detach(const std::vector<std::string>& functions) {
    if (functions.empty()) return;  // an empty selector would mean every probe
    const RunResult r = run(tool({"detach", std::to_string(pid_in_clone_), "--functions", joined(functions), "--json"}));
    if (!r.ok())
        throw Error("iprobe detach in the clone (PID " + std::to_string(host_pid_) + ") failed: " + trimmed(r.err));
}

pid_t CloneProbes::start_trace(bool json, int out_fd, int err_fd) const {
    // Line-buffered so the trace streams through a pipe or file as it comes.
    std::vector<std::string> argv;
    if (!find_program("stdbuf").empty()) argv = {"stdbuf", "-oL"};
    const auto trace = tool({"trace", std::to_string(pid_in_clone_)});
    argv.insert(argv.end(), trace.begin(), trace.end());
    if (json) argv.insert(argv.end(), {"--format", "json"});
    return spawn(argv, out_fd, err_fd, true);
}

hotpatch::TraceReader& CloneProbes::reader() {
    if (!reader_) reader_ = std::make_unique<hotpatch::TraceReader>(host_pid_, hotpatch::TraceReader::Access::aggregates);
    return *reader_;
}

std::vector<CloneProbes::Events> CloneProbes::events(const std::vector<std::string>& symbols) {
    hotpatch::TraceReader& r = reader();
    // Which aggregate slots feed each symbol: known once its probes are in
    // the region (attach adds modules, never moves them).
    if (stats_for_ != symbols || probes_seen_ != r.probe_count()) {
        std::map<std::string, std::size_t> index;
        for (std::size_t i = 0; i < symbols.size(); ++i) index.emplace(symbols[i], i);
        stats_of_.assign(symbols.size(), {});
        const auto& infos = r.probes();
        const auto states = r.probe_states();
        for (std::size_t p = 0; p < infos.size() && p < states.size(); ++p) {
            const auto it = index.find(infos[p].symbol);
            if (it == index.end() || states[p].stat == IPROBE_RT_NO_STAT) continue;
            auto& slots = stats_of_[it->second];
            if (std::find(slots.begin(), slots.end(), states[p].stat) == slots.end()) slots.push_back(states[p].stat);
        }
        stats_for_ = symbols;
        probes_seen_ = r.probe_count();
    }
    const auto sums = r.sums();
    std::vector<Events> out(symbols.size());
    for (std::size_t i = 0; i < symbols.size(); ++i)
        for (std::uint32_t stat : stats_of_[i])
            if (stat < sums.size()) {
                out[i].entries += sums[stat].calls;
                out[i].exits += sums[stat].completed;
            }
    return out;
}

std::vector<hotpatch::FunctionStats> CloneProbes::functions() {
    hotpatch::TraceReader& r = reader();
    return r.functions(r.sums());
}

}  // namespace iprobe::launcher
