// Probes in a clone, through its probe agent: one `iprobe-hotpatch agent`
// started with the clone inside its PID and mount namespaces (a CRIU clone
// has production's PID there and its own /run/iprobe, so its locks never
// meet production's; a container clone's runs here on its host PID), spoken
// to in agent_protocol.h's messages for its whole life: attach, detach and
// the trace stream cost no process.  The aggregates are read in-process
// through the clone's host PID.
#pragma once

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "iprobe/hotpatch/agent.h"
#include "iprobe/hotpatch/trace_reader.h"
#include "iprobe/probelist/probe_list.h"
#include "iprobe/support/fd.h"

namespace iprobe::launcher {

// The functions a selector picks from probe sources (probe lists or probed
// binaries), as raw symbols in list order, each once: what a session splits
// among clones and turns on and off by name.
std::vector<std::string> selected_functions(const std::vector<std::string>& sources,
                                            const std::vector<std::string>& function_globs);

// What a session's probes record and for which calls (--args --retval
// --backtrace, --when, --min-duration), as the agent's Attach carries it.
hotpatch::agent::Attach probes_recording(const hotpatch::ValueOptions& values, const std::string& when,
                                          const std::string& min_duration);

// A clone's trace records as a session writes them on stdout: "trace"
// events (JSON; with "clone": N when `clone` is given) or lines for people
// (prefixed "[clone N+1] " when given).
std::string session_trace_lines(const std::vector<hotpatch::TraceRecord>& records, bool json,
                                std::optional<int> clone = std::nullopt);

class CloneProbes {
public:
    // Starts the agent.  `host_pid`: the clone's root as this host sees it;
    // `in_clone` the command prefix that runs a tool where the clone is
    // (empty: here) and `pid_in_clone` its PID there.  `recording`: what
    // every attach asks the probes to record and for which calls (its
    // values, --when, --min-duration; its functions unused), carried in the
    // agent's Attach request.
    CloneProbes(const std::string& hotpatch_tool, const std::vector<std::string>& in_clone, pid_t pid_in_clone,
                pid_t host_pid, const std::vector<std::string>& probe_sources,
                const hotpatch::agent::Attach& recording = {});
    // Closes the channel (the agent ends), waits for it, kills its group
    // if it lingers.
    ~CloneProbes();
    CloneProbes(const CloneProbes&) = delete;
    CloneProbes& operator=(const CloneProbes&) = delete;

    // `functions`: raw symbols (empty: every probe of the sources).  Throw
    // Error with the agent's message, or saying the agent is gone.
    hotpatch::AttachStats attach(const std::vector<std::string>& functions);
    // The same with what the probes do (handler, --completed) when not the
    // agent's defaults.
    hotpatch::AttachStats attach(const hotpatch::agent::Attach& request);
    void detach(const std::vector<std::string>& functions);
    // `iprobe patch` in the clone (live_patch.h).
    hotpatch::PatchStats patch(const std::vector<hotpatch::FunctionPatch>& patches);
    // The trace stream: records arrive on fd(), pump() reads them.
    // `lossless`: the clone's threads wait for the agent instead of dropping.
    void start_trace(bool lossless = false);
    void stop_trace();
    int fd() const { return agent_->fd(); }
    // False once the agent is gone; why_gone() says why.
    bool pump() { return agent_->pump(); }
    std::vector<hotpatch::TraceRecord> take_trace() { return agent_->take_trace(); }
    std::uint64_t trace_dropped() const { return agent_->trace_dropped(); }
    std::string why_gone();
    // The agent ended because the clone's process exited (it said so, or the
    // process is gone: a CRIU clone's PID namespace ends with it, taking the
    // agent along before it can say anything), not by dying on its own.
    bool target_exited() const;
    pid_t agent_pid() const { return agent_pid_; }

    // The region's per-function sums, read here (after the first attach).
    hotpatch::TraceReader& reader();
    // Entry and exit events per symbol of `symbols`, cumulative.
    struct Events {
        std::uint64_t entries = 0, exits = 0;
    };
    std::vector<Events> events(const std::vector<std::string>& symbols);
    // The report rows now (functions called since the first attach).
    std::vector<hotpatch::FunctionStats> functions();

    pid_t host_pid() const { return host_pid_; }

private:
    pid_t host_pid_;
    hotpatch::agent::Attach recording_;
    pid_t agent_pid_ = -1;
    UniqueFd agent_err_;  // its stderr: what it said before it ended
    std::unique_ptr<hotpatch::AgentClient> agent_;
    std::unique_ptr<hotpatch::TraceReader> reader_;
    std::vector<std::vector<std::uint32_t>> stats_of_;  // per symbol asked for by events(): its aggregate slots
    std::vector<std::string> stats_for_;                // ... for these symbols
    std::uint32_t probes_seen_ = 0;
};

}  // namespace iprobe::launcher
