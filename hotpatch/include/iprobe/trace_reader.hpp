// Reads the events a process's runtime logged into its shared-memory region
// (/dev/shm/iprobe.<pid>) from outside, while the writers are live, and
// symbolizes them from the probe lists the attacher recorded.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "iprobe/probe_list.hpp"

namespace iprobe::hotpatch {

struct Event {
    std::uint64_t tsc = 0;
    std::uint64_t time_ns = 0;  // CLOCK_REALTIME nanoseconds
    std::uint32_t probe = 0;    // global probe index
    std::uint32_t tid = 0;
    ProbeKind kind = ProbeKind::entry;
    std::uint16_t depth = 0;    // handler nesting (signal re-entrancy)
    std::uint8_t nargs = 0;     // POINT events
    std::uint64_t args[4] = {0, 0, 0, 0};
};

struct ProbeInfo {
    std::string function;  // demangled
    std::string file;
    std::uint32_t line = 0;
    ProbeKind kind = ProbeKind::entry;
    std::string module;
};

class TraceReader {
public:
    // Throws Error(not_found) when the process has no region (never attached).
    explicit TraceReader(pid_t pid);
    ~TraceReader();
    TraceReader(const TraceReader&) = delete;
    TraceReader& operator=(const TraceReader&) = delete;

    // Consumes every published record of every ring, oldest first per thread.
    std::size_t drain(const std::function<void(const Event&)>& sink);

    // Probe metadata by global index (re-reads the module table when it grew).
    const ProbeInfo& probe(std::uint32_t index);
    std::uint32_t probe_count() const;

    // Records lost to full rings since the last take_dropped().
    std::uint64_t dropped() const;
    std::uint64_t take_dropped();                 // ...and marks them reported
    std::uint64_t lost_events() const;            // no ring / unknown site (cumulative)
    std::uint64_t calls(std::uint32_t index) const;  // count-handler counter
    std::uint64_t take_calls(std::uint32_t index);   // ...read and reset to 0
    double tsc_hz() const;
    pid_t pid() const;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace iprobe::hotpatch
