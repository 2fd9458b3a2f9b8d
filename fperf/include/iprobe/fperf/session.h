// The daemon's side of the shared memory (iprobe/formats/fperf_region.h): creates
// /dev/shm/fperf.<pid>, registers functions, refills quotas, reads results.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "iprobe/fperf/events.h"
#include "iprobe/formats/fperf_region.h"

namespace iprobe::fperf {

struct SessionConfig {
    std::uint32_t slot_count = 1u << 16;  // rounded up to a power of two
    std::uint32_t table_mode = FPERF_TABLE_OPEN;
    std::vector<MeasuredEvent> events;    // at most FPERF_MAX_EVENTS
    std::int64_t initial_quota = 1;       // every function's first quota
    std::uint64_t heartbeat_timeout_ns = 2'000'000'000;
};

struct SlotSnapshot {
    std::uint64_t address = 0;
    std::uint64_t calls = 0;
    std::uint64_t samples = 0;
    std::uint64_t wall_ns = 0;
    std::uint64_t cpu_ns = 0;
    std::uint64_t events[FPERF_MAX_EVENTS] = {};
    std::uint32_t slot = 0;
};

std::string shm_path(pid_t pid);
std::uint64_t monotonic_ns();

class SharedSession {
public:
    // Replaces any earlier session of `pid` (marking it closed so a resident
    // handler lets go of it).  The file is owned by the target's user, 0600.
    static SharedSession create(pid_t pid, const SessionConfig& config);
    SharedSession() = default;
    SharedSession(SharedSession&& other) noexcept;
    SharedSession& operator=(SharedSession&& other) noexcept;
    SharedSession(const SharedSession&) = delete;
    SharedSession& operator=(const SharedSession&) = delete;
    ~SharedSession();

    fperf_shm_header& header() const { return *header_; }
    fperf_function_slot* slots() const;
    // Puts `address` in the table (idempotent); false when the table is full.
    bool register_function(std::uint64_t address);
    void heartbeat();
    void set_state(fperf_session_state state);
    bool handler_ready() const;

    std::vector<SlotSnapshot> snapshot() const;
    void set_quota(std::uint32_t slot, std::int64_t quota);
    // Quota of every occupied slot to zero: the handler stops sampling.
    void freeze();
    // Marks the session closed and removes the file (the handler keeps its
    // mapping until it notices).
    void close();

private:
    fperf_shm_header* header_ = nullptr;
    std::size_t size_ = 0;
    std::string path_;
    bool closed_ = false;
};

} // namespace iprobe::fperf
