#include "clone_probes.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <thread>

#include "iprobe/hotpatch/agent_protocol.h"
#include "iprobe/hotpatch/output.h"
#include "iprobe/probelist/probe_source.h"
#include "iprobe/support/json.h"
#include "iprobe/support/proc.h"
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

hotpatch::agent::Attach probes_recording(const hotpatch::ValueOptions& values, const std::string& when,
                                          const std::string& min_duration) {
    hotpatch::agent::Attach a;
    a.values = values;
    a.when = when;
    a.min_duration = min_duration;
    return a;
}

std::string session_trace_lines(const std::vector<hotpatch::TraceRecord>& records, bool json, std::optional<int> clone) {
    std::string out;
    for (const hotpatch::TraceRecord& r : records) {
        if (json) {
            JsonWriter w;
            w.begin_object().field("event", "trace");
            if (clone) w.field("clone", *clone);
            hotpatch::write_trace_record_fields(w, r);
            out += w.end_object().str();
            out += '\n';
        } else {
            if (clone) out += "[clone " + std::to_string(*clone + 1) + "] ";
            out += hotpatch::trace_text_line(r);
        }
    }
    return out;
}

CloneProbes::CloneProbes(const std::string& hotpatch_tool, const std::vector<std::string>& in_clone,
                         pid_t pid_in_clone, pid_t host_pid, const std::vector<std::string>& probe_sources,
                         const hotpatch::agent::Attach& recording)
    : host_pid_(host_pid), recording_(recording) {
    std::vector<std::string> argv = in_clone;
    argv.insert(argv.end(), {hotpatch_tool, "agent", std::to_string(pid_in_clone)});
    if (!probe_sources.empty()) argv.insert(argv.end(), {"--probes", joined(probe_sources)});
    int pair[2], err[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) < 0) throw_errno("socketpair");
    UniqueFd ours(pair[0]), theirs(pair[1]);
    if (::pipe2(err, O_CLOEXEC) < 0) throw_errno("pipe");
    UniqueFd err_read(err[0]), err_write(err[1]);
    // Its own process group: nsenter --pid runs the agent as its child.
    agent_pid_ = spawn(argv, theirs.get(), err_write.get(), true, {}, theirs.get());
    agent_err_ = std::move(err_read);
    agent_ = std::make_unique<hotpatch::AgentClient>(std::move(ours));
}

CloneProbes::~CloneProbes() {
    agent_.reset();  // its channel closes: the agent stops tracing and ends
    if (agent_pid_ <= 0) return;
    int status;
    for (int i = 0; i < 500; ++i) {
        if (::waitpid(agent_pid_, &status, WNOHANG) == agent_pid_) return;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ::kill(-agent_pid_, SIGKILL);
    ::waitpid(agent_pid_, &status, 0);
}

bool CloneProbes::target_exited() const {
    if (agent_->target_exited()) return true;
    const char state = proc::state(host_pid_);
    return state == 0 || state == 'Z' || state == 'X';
}

std::string CloneProbes::why_gone() {
    std::string said;
    char buf[4096];
    for (;;) {
        pollfd p{agent_err_.get(), POLLIN, 0};
        if (!agent_err_ || ::poll(&p, 1, 0) <= 0) break;
        const ssize_t n = ::read(agent_err_.get(), buf, sizeof buf);
        if (n <= 0) break;
        said.append(buf, static_cast<std::size_t>(n));
        if (said.size() > 4096) break;
    }
    said = trimmed(said);
    const std::string reason = agent_->exit_reason().empty() ? "its channel closed" : agent_->exit_reason();
    return reason + (said.empty() ? std::string() : ": " + said);
}

hotpatch::AttachStats CloneProbes::attach(const std::vector<std::string>& functions) {
    hotpatch::agent::Attach request = recording_;
    request.functions = functions;
    return attach(request);
}

hotpatch::AttachStats CloneProbes::attach(const hotpatch::agent::Attach& request) {
    try {
        return *agent_->call(request).attached;
    } catch (const Error& e) {
        throw Error("attach in the clone (PID " + std::to_string(host_pid_) + ") failed: " + e.what() +
                        (agent_->alive() ? std::string() : " (" + why_gone() + ")"),
                    e.code());
    }
}

void CloneProbes::detach(const std::vector<std::string>& functions) {
    if (functions.empty()) return;  // an empty selection would mean every probe
    try {
        agent_->call(hotpatch::agent::Detach{functions});
    } catch (const Error& e) {
        throw Error("detach in the clone (PID " + std::to_string(host_pid_) + ") failed: " + e.what(), e.code());
    }
}

hotpatch::PatchStats CloneProbes::patch(const std::vector<hotpatch::FunctionPatch>& patches) {
    try {
        return *agent_->call(hotpatch::agent::Patch{patches, false}).patched;
    } catch (const Error& e) {
        throw Error("patch in the clone (PID " + std::to_string(host_pid_) + ") failed: " + e.what() +
                        (agent_->alive() ? std::string() : " (" + why_gone() + ")"),
                    e.code());
    }
}

void CloneProbes::start_trace(bool lossless) { agent_->call(hotpatch::agent::Trace{true, lossless}); }

void CloneProbes::stop_trace() {
    if (agent_->alive()) agent_->call(hotpatch::agent::Trace{false});
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
