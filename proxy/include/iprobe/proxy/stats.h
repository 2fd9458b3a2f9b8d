// The mirror's counters: the document its stats endpoint serves (and SIGUSR1
// prints), and the typed view other tools read it through.  One definition
// for the writer and every reader.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "iprobe/proxy/address.h"

namespace iprobe {
class JsonWriter;
}

namespace iprobe::proxy {

struct DivergenceReportStats {
    std::uint64_t connection = 0;
    // Reply number in the connection, or byte offset for stream comparison
    // and the aggregator (then serialized as "byte_offset").
    std::uint64_t index = 0;
    bool index_is_byte_offset = false;
    std::string request, production, debug;
    double at_s = 0;
    std::uint32_t debug_target = 0;  // index of the debug copy (--debug order)
    bool operator==(const DivergenceReportStats&) const = default;
};

// Replies compared with production's, by the mirror (each debug copy's) or
// by `iprobe replay --compare` (the replayed service's against the recorded).
struct DivergenceStats {
    std::string mode;  // off | stream | resp | http
    // mismatches: replies that differ and that no other interleaving of
    // concurrent connections explains (the copy diverged); reordered: replies
    // that differ only as another interleaving would make them (the copy's
    // reply is production's reply to the same request sent at about the same
    // time, see proxy/README.md); unclassified: differences not yet told
    // apart (at most a second old).
    std::uint64_t compared = 0, ignored = 0, mismatches = 0, diverged_connections = 0, unchecked_connections = 0;
    std::uint64_t reordered = 0, unclassified = 0;
    std::vector<DivergenceReportStats> reports;  // the first difference of each diverged connection (<= 100)
    bool operator==(const DivergenceStats&) const = default;
};

struct MirrorStats {
    std::string mode;  // "duplicator" | "aggregator" | "capture"
    double uptime_s = 0;
    struct Connections {
        std::uint64_t accepted = 0, active = 0, closed = 0, lingering_debug = 0;
        std::uint64_t production_connect_failures = 0, production_errors = 0;
        bool operator==(const Connections&) const = default;
    } connections;
    struct Bytes {
        std::uint64_t client_to_production = 0, production_to_client = 0, to_debug = 0, from_debug = 0;
        bool operator==(const Bytes&) const = default;
    } bytes;
    struct Debug {
        std::string address;  // empty when there is no debug copy
        std::uint64_t connections = 0, connect_failures = 0, errors = 0, closed_early = 0, completed = 0,
                      linger_timeouts = 0;
        bool operator==(const Debug&) const = default;
    } debug;
    // One per --debug address: how far behind the stream that copy is now.
    struct DebugTarget {
        std::string address;
        std::uint64_t connections = 0, connect_failures = 0, overflows = 0, diverged_connections = 0;
        std::uint64_t open_legs = 0;  // connections whose copy is still being fed
        std::uint64_t buffered = 0;   // bytes waiting for this copy, all connections
        // Over its open connections, the largest: share of the per-connection
        // buffer in use (0..1); age of the oldest byte not yet sent to it; age
        // of the oldest production reply it has not given yet (0 unless
        // replies are compared by message); replies it owes.
        double max_fill = 0, max_pending_ms = 0, max_reply_lag_ms = 0;
        std::uint64_t replies_behind = 0;
        std::uint64_t bytes = 0;      // sent to it
        bool operator==(const DebugTarget&) const = default;
    };
    std::vector<DebugTarget> debug_targets;
    struct Buffer {
        std::uint64_t per_connection_limit = 0, total_limit = 0, buffered = 0;
        std::uint64_t high_water_total = 0, high_water_connection = 0, overflows = 0;
        bool operator==(const Buffer&) const = default;
    } buffer;
    struct DebugWindows {  // connection start to overflow, in ms
        std::uint64_t count = 0;
        double min = 0, mean = 0, max = 0;
        std::vector<double> recent;
        bool operator==(const DebugWindows&) const = default;
    } debug_windows_ms;
    DivergenceStats divergence;
    struct Aggregator {
        std::uint64_t slots = 0, unclaimed_production_connections = 0, unmatched_debug_connections = 0;
        bool operator==(const Aggregator&) const = default;
    };
    std::optional<Aggregator> aggregator;
    // Capture mode: what the capture saw and what it could not follow.
    struct Capture {
        std::string interface, filter;
        std::int64_t port = 0;
        std::uint64_t ring_bytes = 0;
        std::uint64_t packets = 0;          // TCP segments handed to the mirror
        // Taken by the ring before the capture's filter was in place: set
        // aside, the capture starts after them (tcp_reassembly.h, CaptureStart).
        std::uint64_t packets_before_start = 0;
        std::uint64_t kernel_drops = 0;     // the ring was full (the kernel's count)
        std::uint64_t interface_drops = 0;
        std::uint64_t truncated_packets = 0;
        std::uint64_t flows = 0;            // connections followed now (open, joining, or just closed)
        std::uint64_t untracked_flows = 0;  // not followed: the flow table was full
        std::uint64_t connections_from_start = 0, connections_joined = 0, connections_unjoinable = 0;
        // Connections open now that are not followed yet: waiting for a
        // request to join at (listed in open_connections as "joining").
        std::uint64_t connections_joining = 0;
        // --hold: the clone's start.  Production's connections when it was
        // checkpointed, those fed to the clone from the first request the
        // checkpoint did not hold (skipping the requests it did), and those
        // the clone misses requests of (each also a diverged connection).
        bool holding = false;
        std::uint64_t checkpoint_connections = 0, resumed_connections = 0, skipped_requests = 0;
        std::uint64_t missed_connections = 0, missed_requests = 0;
        // Client bytes lost to the capture: that connection's debug side closed.
        std::uint64_t lost_connections = 0;
        // Production's replies lost to the capture: the copy still fed, its replies no longer compared.
        std::uint64_t lost_reply_connections = 0;
        // Both kinds of loss above by their cause (tcp_reassembly.h's
        // StreamLoss, by name; every cause present, 0 when none).
        std::map<std::string, std::uint64_t> loss_causes;
        // After kernel drops: connections compared with what production's own socket received.
        std::uint64_t checked_with_production = 0;
        std::uint64_t out_of_order_segments = 0, retransmitted_bytes = 0, overlapping_bytes = 0;
        double cpu_s = 0;                   // the mirror's own CPU time (user + system)
        bool operator==(const Capture&) const = default;
    };
    std::optional<Capture> capture;
    struct Record {
        std::string path;
        std::uint64_t records = 0;
        bool stopped_early = false;
        bool operator==(const Record&) const = default;
    };
    std::optional<Record> record;
    // Open connections (at most 100, oldest first) with their debug legs.
    struct ConnectionStats {
        std::uint32_t id = 0;
        double age_ms = 0;
        bool lingering = false;  // the client left; a debug copy is still being fed
        struct Leg {
            std::string state;  // connecting | open | overflowed | capture_loss | closed
            std::uint64_t buffered = 0, high_water = 0;
            double fill = 0, pending_ms = 0, reply_lag_ms = 0;
            std::uint64_t replies_behind = 0;
            bool operator==(const Leg&) const = default;
        };
        std::vector<Leg> debug;  // one per --debug address
        // Capture mode: whose connection, followed from its SYN or joined,
        // and what of it the capture lost.
        // A connection the capture sees but does not follow (no debug legs):
        // status "joining" (no request start seen yet) or "unjoinable".
        struct Captured {
            std::string client;
            bool joined = false, lost_client_bytes = false, lost_replies = false;
            std::string status = "followed";  // followed | joining | unjoinable
            bool operator==(const Captured&) const = default;
        };
        std::optional<Captured> captured;
        bool operator==(const ConnectionStats&) const = default;
    };
    std::vector<ConnectionStats> open_connections;

    bool operator==(const MirrorStats&) const = default;
};

// Writes the members of the stats object (the caller opens and closes it, so
// the mirror can append its open connections).
void write_stats_fields(JsonWriter& json, const MirrorStats& stats);
// The "divergence" object's fields; a replay's reports name the copy's side
// "replay" and carry no session time or copy index.
enum class CompareSource { mirror, replay };
void write_divergence_fields(JsonWriter& json, const DivergenceStats& divergence, CompareSource source);
std::string to_json(const MirrorStats& stats);
// Throws Error(bad_input) naming what is missing or malformed.
MirrorStats parse_mirror_stats(std::string_view json);

// The stats document of the mirror whose --stats endpoint is `at`; nullopt
// when it does not answer within `timeout`.
std::optional<std::string> fetch_mirror_stats(const Endpoint& at, std::chrono::milliseconds timeout);

}  // namespace iprobe::proxy
