// `iprobe mirror`: a TCP proxy that passes clients through to production and
// feeds a copy of every client byte stream to a debug copy of the service,
// without production ever waiting on the debug side.
//
// Duplicator (default): clients connect to `listen`; each connection is
// forwarded to `production`, and its client->server bytes are also queued in a
// bounded per-connection buffer toward `debug`.  The debug copy's replies are
// drained and, with divergence checking on, compared with production's.
//
// Aggregator (`upstream` set): placed between a service and a backend it calls.
// Production's outbound connections arrive on `listen` and pass through to
// `upstream`; the backend's replies are kept.  The debug copy's outbound
// connections arrive on `debug_listen`, never reach the backend, and receive
// production's recorded replies instead: the N-th debug connection gets the
// N-th production connection's reply stream, in order.  This assumes the debug
// copy opens its backend connections in the same order as production and
// sends the same requests on each (true for a clone fed the same input while
// it stays in sync); the debug side's requests are compared with production's
// when divergence checking is on.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "iprobe/proxy/address.h"
#include "iprobe/proxy/framing.h"

namespace iprobe::proxy {

struct MirrorOptions {
    Endpoint listen;
    std::optional<Endpoint> production;    // duplicator: the real service
    std::optional<Endpoint> debug;         // duplicator: the debug copy (none: proxy only)
    std::optional<Endpoint> upstream;      // aggregator: the real backend
    std::optional<Endpoint> debug_listen;  // aggregator: where the debug copy's outbound connections arrive
    std::size_t buffer = 4 << 20;          // per connection, toward the debug side
    std::size_t buffer_total = std::size_t(1) << 30;  // all connections together
    double debug_linger_s = 30;            // how long a debug leg may finish after its client left
    Protocol divergence = Protocol::off;
    DivergenceRules rules = DivergenceRules::defaults();
    std::string record_path;
    std::optional<Endpoint> stats;
    bool json = false;   // ready line and final stats as JSON on stdout
    bool quiet = false;  // no per-event log lines on stderr
};

// What the proxy reports once it listens (ports resolved when 0 was asked).
struct MirrorReady {
    Endpoint listen;
    std::optional<Endpoint> debug_listen;
    std::optional<Endpoint> stats;
};

// Runs until SIGTERM/SIGINT; SIGUSR1 dumps the stats to stderr.  Throws Error
// for bad configuration (ports in use, unwritable record file).
void run_mirror(const MirrorOptions& options, const std::function<void(const MirrorReady&)>& on_ready);

// The readiness event, {"event":"listening","listen":...,"pid":N}: printed
// with --json and written to --ready-fd, where a supervising tool waits for it.
std::string ready_event_json(const MirrorReady& ready, pid_t pid);
// Throws Error(bad_input) when `json` is not a readiness event.
MirrorReady parse_ready_event(std::string_view json);

}  // namespace iprobe::proxy
