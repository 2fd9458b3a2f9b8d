// The probe agent's protocol: one JSON object a line each way over a pipe or
// socket pair.  A probe agent (agent.h) is one long-lived process beside a
// target, where the target's PID and files are visible (inside a clone's PID
// and mount namespaces): the launcher starts it once per clone and then
// attaches, detaches, changes the selection, asks its status and receives
// the trace as messages, never as another process or text meant for people.
//
// The same schemas are what `iprobe attach|detach --json` and
// `iprobe trace --format json` print (one writer each, output.h), so a
// caller that runs the CLI reads them with the decoders here.
//
// Requests carry an id, echoed by their Reply; trace records and the agent's
// end come unasked, between replies.  Decoders throw Error(bad_input) for a
// line that is not a message of this protocol.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "iprobe/hotpatch/hotpatch.h"
#include "iprobe/hotpatch/live_patch.h"
#include "iprobe/hotpatch/trace_reader.h"
#include "iprobe/probelist/probe_list.h"

namespace iprobe::hotpatch {

std::string to_json(const AttachStats& stats, pid_t pid);
AttachStats attach_stats_from_json(std::string_view json);
std::string to_json(const DetachStats& stats, pid_t pid);
DetachStats detach_stats_from_json(std::string_view json);

std::string to_json(const TraceRecord& record);
// Its fields, inside an object the caller opens (a session's "trace" event):
// issue 29's schema, an entry's "args":[{"name","type","value"}], an exit's
// "retval":{"type","value"}, "backtrace":[{"address","function"[,"file","line"]}].
// `with_text`: each value also carries its "text" (how people read it), so
// a decoder gives back the whole Value (the agent's messages).
void write_trace_record_fields(JsonWriter& json, const TraceRecord& record, bool with_text = false);
TraceRecord trace_record_from_json(std::string_view json);

namespace agent {

// Functions are raw symbols, matched exactly (never as globs): the caller
// selected them once (probelist::ProbeSelector) from the same sources the
// agent was started with.  An empty list in Attach means every probe of the
// sources; in Detach and Select, none.
struct Attach {
    Attach() = default;
    explicit Attach(std::vector<std::string> names, std::optional<HandlerMode> mode = std::nullopt, bool exits = false)
        : functions(std::move(names)), handler(mode), completed(exits) {}
    std::vector<std::string> functions;
    // What the probes do, when not the agent's own (AgentOptions::attach):
    // the handler, and with the count handler whether the exits are on to
    // count completed calls too (`--completed`, AttachOptions::count_exits).
    std::optional<HandlerMode> handler;
    bool completed = false;
    // What the trace handler records besides the call (`--args --retval
    // --backtrace`, the return value's histogram with --retval) and for which
    // calls (`--when EXPR`, `--min-duration TIME`; empty: every call), as
    // AttachOptions has them.
    ValueOptions values;
    std::string when;
    std::string min_duration;
};
struct Detach {
    std::vector<std::string> functions;
};
// Makes exactly `functions` probed: attaches the missing, detaches the rest.
struct Select {
    std::vector<std::string> functions;
};
struct Status {};
// Replaces functions (`iprobe patch`, live_patch.h) in the agent's target.
struct Patch {
    std::vector<FunctionPatch> patches;
    bool force = false;
};
// Starts (or stops) the trace stream: TraceRecord messages until stopped.
// `lossless`: the target's threads wait for the agent when their ring is
// full instead of dropping (TraceReader::set_lossless) -- for a clone,
// whose waiting harms no user.
struct Trace {
    bool on = true;
    bool lossless = false;
};
using RequestBody = std::variant<Attach, Detach, Select, Status, Trace, Patch>;

struct Request {
    std::uint64_t id = 0;
    RequestBody body;
};
std::string encode(const Request& request);
Request decode_request(std::string_view line);

// What the agent has on, by function, and whether it streams the trace.
struct AgentStatus {
    pid_t pid = 0;  // the target, as the agent sees it
    std::vector<std::string> functions;  // probed now, in the order first attached
    bool tracing = false;
    std::uint64_t trace_records = 0;  // sent so far
    bool operator==(const AgentStatus&) const = default;
};

struct Reply {
    std::uint64_t id = 0;
    bool ok = true;
    std::string error;  // when !ok: what failed, as the library said it
    int exit_code = 0;  // when !ok: the ExitCode of that error
    std::optional<AttachStats> attached;  // Attach, Select (what it turned on)
    std::optional<DetachStats> detached;  // Detach, Select (what it turned off)
    std::optional<AgentStatus> status;    // Status
    std::optional<PatchStats> patched;    // Patch
};
// The trace's end (Trace{false}, or the target exited): what the stream lost.
struct TraceEnd {
    std::uint64_t records = 0;
    std::uint64_t dropped = 0;  // ring full in the target, since the last TraceEnd
};
// The agent stops on its own (target gone); sent last.
struct Exit {
    std::string reason;
};
using Message = std::variant<Reply, TraceRecord, TraceEnd, Exit>;
std::string encode(const Message& message);
Message decode_message(std::string_view line);

}  // namespace agent
}  // namespace iprobe::hotpatch
