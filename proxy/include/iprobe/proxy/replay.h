// `iprobe replay`: feeds a recording made by `iprobe mirror --record` into a
// service.  Each recorded connection becomes one connection, its bytes sent in
// order at the recorded times (scaled by `speed`; 0 = as fast as possible).
// Across connections, with `compare` resp or http (requests and replies
// framed), requests go in the order they reached production (the order of
// the recording, which the mirror writes as production's traffic passes
// it): a request is sent only once every request before it on the other
// connections was answered, so concurrent writers (two clients INCRementing
// one key) are replayed in production's interleaving.  Otherwise (stream,
// off) order across connections follows the timestamps only.
//
// With `compare` on, the service's replies are compared with production's
// replies as recorded, message by message (resp, http) or byte by byte
// (stream): how faithfully the replay reproduced what production did.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "iprobe/proxy/address.h"
#include "iprobe/proxy/framing.h"
#include "iprobe/proxy/stats.h"

namespace iprobe::proxy {

struct ReplayOptions {
    std::string path;
    Endpoint to;
    double speed = 1.0;
    double drain_timeout_s = 10;  // wait for the service to answer and close after the last byte
    Protocol compare = Protocol::off;
    DivergenceRules rules = DivergenceRules::defaults();
    // With compare resp/http: production's order across connections (above).
    bool ordered = true;
    // How long a request waits for the other connections' replies before it
    // goes anyway (a request that is never answered: counted).
    double order_wait_s = 2;
};

struct ReplayResult {
    std::uint64_t connections = 0;
    std::uint64_t connect_failures = 0;
    std::uint64_t send_failures = 0;
    std::uint64_t bytes_sent = 0;
    std::uint64_t bytes_received = 0;
    std::uint64_t unfinished = 0;  // still open when the drain timeout ran out
    bool ordered = false;          // requests went in production's order across connections
    std::uint64_t order_timeouts = 0;  // requests sent before every earlier one was answered
    double recorded_s = 0;
    double elapsed_s = 0;
    // compare: replies (or bytes, stream) compared and how many differed;
    // connections whose replies differed at least once; connections that
    // could not be compared (no recorded replies, a protocol error).
    DivergenceStats comparison;
};

ReplayResult run_replay(const ReplayOptions& options);

// The result as one JSON object (what `iprobe replay --json` prints).
std::string to_json(const ReplayResult& result);
// "replies compared with production's: 8 compared, 0 differ (...)".
std::string comparison_summary(const DivergenceStats& comparison);

}  // namespace iprobe::proxy
