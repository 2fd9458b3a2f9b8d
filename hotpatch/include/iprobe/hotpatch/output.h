// One output model for `iprobe attach|detach|status|report|trace` (bpftrace's
// Output is the model): each command builds a typed result, and a writer
// turns it into text for people, JSON, Chrome trace events, folded stacks or
// Prometheus exposition.  The CLI picks a writer by --format and hands it
// results; it writes nothing itself.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "iprobe/hotpatch/hotpatch.h"
#include "iprobe/hotpatch/live_patch.h"
#include "iprobe/hotpatch/trace_reader.h"

namespace iprobe {
class JsonWriter;
}

namespace iprobe::hotpatch {

enum class OutputFormat { text, json, chrome, folded, prometheus };
// nullopt for a name that is none of them.
std::optional<OutputFormat> parse_output_format(std::string_view name);
std::string_view to_string(OutputFormat format);

// What a command produces.
enum class ResultKind { attach, detach, status, report, reset, folded, trace };
// Whether `format` has a writer for `kind` (checked before a command acts).
bool writes(OutputFormat format, ResultKind kind);

struct AttachResult {
    pid_t pid = 0;
    AttachStats stats;
};
struct DetachResult {
    pid_t pid = 0;
    DetachStats stats;
};
struct StatusResult {
    Status status;
    std::vector<PatchedFunction> patches;  // functions replaced by `iprobe patch`
};
// Per-function aggregates of one process or several merged.
struct ReportResult {
    std::vector<pid_t> pids;
    std::vector<FunctionStats> functions;  // the heaviest first
    std::uint64_t unmatched_exits = 0, unhooked_returns = 0, lost = 0, trace_dropped = 0;
    std::uint64_t unhooked_pool_empty = 0;   // of unhooked_returns: the return pool was taken by other threads
    std::uint64_t exits_lost_at_detach = 0;  // calls in flight when a detach turned their exit hooks off
    std::uint64_t now_ns = 0;  // CLOCK_REALTIME when read: what "probed" shares are of
    // `report --hist`: each function's log2 latency histogram (and its
    // return value's, after attach --retval), histogram.h.
    bool histograms = false;
    // `iprobe run`: the modules it was asked to probe (--module NAME,
    // --probes SOURCE) that the program never loaded.
    std::vector<std::string> never_loaded;
};
struct ResetResult {
    pid_t pid = 0;
};
// Exclusive nanoseconds per call path "outer;inner;leaf".
struct FoldedStacks {
    std::map<std::string, std::uint64_t> exclusive_ns;
    // Calls whose exit came without a time (attach --no-durations): not
    // folded, having no duration; said on stderr by the command.
    std::uint64_t unstamped_calls = 0;
};

// A writer.  Each method writes one result whole; one it has no writer for
// (writes() is false) throws Error(usage).
class Output {
public:
    explicit Output(std::ostream& out) : out_(out) {}
    virtual ~Output() = default;
    Output(const Output&) = delete;
    Output& operator=(const Output&) = delete;

    virtual void attached(const AttachResult& result);
    virtual void detached(const DetachResult& result);
    virtual void status(const StatusResult& result);
    virtual void report(const ReportResult& result);
    virtual void reset(const ResetResult& result);
    virtual void folded(const FoldedStacks& stacks);
    // A trace stream: begin, a record per event, end.
    virtual void trace_begin(pid_t pid);
    virtual void trace(const TraceRecord& record);
    virtual void trace_end();

protected:
    [[noreturn]] void unsupported(ResultKind kind) const;
    virtual OutputFormat format() const = 0;
    std::ostream& out_;
};

std::unique_ptr<Output> make_output(OutputFormat format, std::ostream& out);

// "SECONDS.NANOS    TID   -> function" with two spaces per open call.
std::string trace_text_line(const TraceRecord& record);

// A report's rows sorted as every writer shows them: inclusive time, calls,
// name.
void sort_report(std::vector<FunctionStats>& rows);

// A function replaced by `iprobe patch`: "F -> LIB:SYMBOL", and its JSON
// object (`iprobe patch --json`, `iprobe status --json`).
std::string describe_patched(const PatchedFunction& function);
void write_patched(JsonWriter& json, const PatchedFunction& function);

}  // namespace iprobe::hotpatch
