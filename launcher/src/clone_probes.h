// Probes in a clone.  Attach, detach and trace run `iprobe-hotpatch` as a
// child inside the clone's PID and mount namespaces (a CRIU clone has
// production's PID there and its own /run/iprobe, so its locks never meet
// production's); a container clone's run here on its host PID.  The
// aggregates are read in-process through the clone's host PID.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "iprobe/hotpatch/attach_report.h"
#include "iprobe/hotpatch/trace_reader.h"
#include "iprobe/probelist/probe_list.h"

namespace iprobe::launcher {

// The functions a selector picks from probe sources (probe lists or probed
// binaries), as raw symbols in list order, each once: what a session splits
// among clones and turns on and off by name.
std::vector<std::string> selected_functions(const std::vector<std::string>& sources,
                                            const std::vector<std::string>& function_globs);

class CloneProbes {
public:
    // `host_pid`: the clone's root as this host sees it; `in_clone` the
    // command prefix that runs a tool where the clone is (empty: here) and
    // `pid_in_clone` its PID there.
    // `values`: what each attach asks the probes to record (--args, ...).
    CloneProbes(std::string hotpatch_tool, std::vector<std::string> in_clone, pid_t pid_in_clone, pid_t host_pid,
                std::vector<std::string> probe_sources, hotpatch::ValueOptions values = {});

    // `functions`: globs or symbols (empty: every probe of the sources).
    // Throws Error with the tool's message.
    hotpatch::AttachStats attach(const std::vector<std::string>& functions);
    void detach(const std::vector<std::string>& functions);
    // `iprobe trace` of the clone, in its own process group, writing to
    // `out_fd` (JSON lines when `json`).
    pid_t start_trace(bool json, int out_fd, int err_fd) const;

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
    std::vector<std::string> tool(const std::vector<std::string>& args) const;

    std::string hotpatch_tool_;
    std::vector<std::string> in_clone_;
    pid_t pid_in_clone_, host_pid_;
    std::vector<std::string> probe_sources_;
    hotpatch::ValueOptions values_;
    std::unique_ptr<hotpatch::TraceReader> reader_;
    std::vector<std::vector<std::uint32_t>> stats_of_;  // per symbol asked for by events(): its aggregate slots
    std::vector<std::string> stats_for_;                // ... for these symbols
    std::uint32_t probes_seen_ = 0;
};

}  // namespace iprobe::launcher
