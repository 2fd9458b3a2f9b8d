// `fperf record`: set up the shared memory, get the handler into the target,
// run the control daemon until the target exits or time is up, write the data.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "iprobe/fperf/quota.h"

namespace iprobe::fperf {

struct RecordOptions {
    pid_t pid = 0;                        // attach to this process, or
    std::vector<std::string> command;     // start this program
    std::vector<std::string> probe_sources;
    std::vector<std::string> function_globs;
    std::vector<std::string> events;      // empty = default_events()
    bool events_given = false;
    bool strict = false;                  // unavailable asked-for event = failure
    bool unlimited = false;               // no budget: every call sampled
    double budget = 0.05;
    std::uint64_t interval_ns = 100'000'000;
    double duration_s = 0;                // 0 = until the target exits / SIGINT
    std::string output = "fperf.data";
    std::string handler_library;          // empty = next to this program
    std::uint32_t table_slots = 1u << 16;
    bool quiet = false;
    bool keep_probes = false;             // never remove probes of functions too hot to count
};

// Returns the process exit code; throws iprobe::Error for failures.
int record(const RecordOptions& options);

// build/lib/libfperf-handler.so relative to this executable, or $FPERF_HANDLER.
std::string default_handler_library();

} // namespace iprobe::fperf
