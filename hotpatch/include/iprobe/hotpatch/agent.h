// A probe agent: one long-lived process beside a target that turns its
// probes on and off and streams its trace on request, spoken to in the
// messages of agent_protocol.h (`iprobe-hotpatch agent PID`, started once
// per clone inside the clone's namespaces by the launcher).  Its probe
// sources are loaded once, when it starts; requests name functions.
//
// AgentClient is the other end: requests and their replies, with the trace
// records that arrive meanwhile kept for the caller.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <deque>
#include <string>
#include <vector>

#include "iprobe/hotpatch/agent_protocol.h"
#include "iprobe/hotpatch/hotpatch.h"
#include "iprobe/support/fd.h"

namespace iprobe::hotpatch {

struct AgentOptions {
    pid_t pid = 0;
    // Probe lists or binaries (empty: the target's executable), loaded once.
    std::vector<std::string> probe_sources;
    // What every attach uses besides its probes: handler, runtime, rings.
    // pid, selections, probe_sources and selector are the agent's.
    AttachOptions attach;
};

// Answers the requests read from `in_fd` on `out_fd` until `in_fd` ends
// (returns 0), the target exits (an Exit message, returns 0) or interrupt()
// is called (returns ExitCode::interrupted).  Throws Error when the sources
// cannot be loaded (nothing is sent then).
int serve_agent(const AgentOptions& options, int in_fd, int out_fd);

class AgentClient {
public:
    // `channel`: a socket (or the two ends of a pipe pair) to the agent.
    explicit AgentClient(UniqueFd channel, std::chrono::milliseconds reply_timeout = std::chrono::seconds(120));
    AgentClient(UniqueFd to_agent, UniqueFd from_agent, std::chrono::milliseconds reply_timeout);

    // Sends one request and waits for its reply.  Throws Error with the
    // agent's message and exit code when it failed, and Error(failure)
    // when the agent ended or did not answer in time.
    agent::Reply call(const agent::RequestBody& body);

    // What to poll for the agent's unasked messages.
    int fd() const { return from_.get(); }
    // Reads what is there without blocking; false once the agent is gone
    // (its channel closed, or it said Exit).
    bool pump();
    // Trace records received so far, in order (taken: the queue empties).
    std::vector<TraceRecord> take_trace();
    std::uint64_t trace_dropped() const { return dropped_; }  // from its TraceEnd messages
    bool alive() const { return alive_; }
    // It ended because its target exited (it said so), not by dying itself.
    bool target_exited() const { return target_exited_; }
    const std::string& exit_reason() const { return exit_reason_; }

private:
    void receive(const std::string& line);
    bool read_some(int timeout_ms);

    UniqueFd to_, from_;
    std::chrono::milliseconds timeout_;
    std::uint64_t next_id_ = 1;
    std::string partial_;
    std::deque<TraceRecord> trace_;
    std::deque<agent::Reply> replies_;
    std::uint64_t dropped_ = 0;
    bool alive_ = true;
    bool target_exited_ = false;
    std::string exit_reason_;
};

}  // namespace iprobe::hotpatch
