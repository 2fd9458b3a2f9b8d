// `iprobe replay`: feeds a recording made by `iprobe mirror --record` into a
// service.  Each recorded connection becomes one connection, its bytes sent in
// order at the recorded times (scaled by `speed`; 0 = as fast as possible).
// Order across connections follows the timestamps only: requests the
// original clients raced against each other may interleave differently.
#pragma once

#include <cstdint>
#include <string>

#include "iprobe/proxy/address.h"

namespace iprobe::proxy {

struct ReplayOptions {
    std::string path;
    Endpoint to;
    double speed = 1.0;
    double drain_timeout_s = 10;  // wait for the service to answer and close after the last byte
};

struct ReplayResult {
    std::uint64_t connections = 0;
    std::uint64_t connect_failures = 0;
    std::uint64_t send_failures = 0;
    std::uint64_t bytes_sent = 0;
    std::uint64_t bytes_received = 0;
    std::uint64_t unfinished = 0;  // still open when the drain timeout ran out
    double recorded_s = 0;
    double elapsed_s = 0;
};

ReplayResult run_replay(const ReplayOptions& options);

}  // namespace iprobe::proxy
