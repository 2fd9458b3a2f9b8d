// `iprobe mirror`: a TCP proxy that passes clients through to production and
// feeds a copy of every client byte stream to a debug copy of the service,
// without production ever waiting on the debug side.
//
// Duplicator (default): clients connect to `listen`; each connection is
// forwarded to `production`, and its client->server bytes are also queued, in
// a bounded buffer per connection and debug copy, toward every `debug`
// address (one or more copies of the service, each fed the whole stream).
// The debug copies' replies are drained and, with divergence checking on,
// compared with production's.
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
//
// Capture (`capture` set): nothing is in production's path.  Production's
// traffic on its port is captured off an interface (libpcap: the kernel's
// TPACKET_V3 ring and a BPF filter), each TCP connection is reassembled in
// both directions, and each client connection gets a matching connection to
// the debug copy, fed the client's bytes; the copy's replies are compared
// with production's captured replies.  Bytes the capture loses (its ring was
// full: the receiver acknowledged bytes the capture never saw) end that
// connection's debug side: the copy is never fed a stream with a hole.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "iprobe/proxy/address.h"
#include "iprobe/proxy/framing.h"

namespace iprobe::proxy {

// `--capture [IFACE:]PORT`: where production's traffic is taken off the wire.
struct CaptureOptions {
    std::string interface = "any";  // "any": every interface of this network namespace
    int port = 0;                   // production's port
    std::size_t ring = 32 << 20;    // the kernel's capture ring, bytes
    // How to find a request boundary in connections already open when the
    // capture starts (RESP, HTTP); off: only connections whose SYN is captured.
    Protocol join = Protocol::off;
    std::string str() const { return interface + ":" + std::to_string(port); }
};
// Parses [IFACE:]PORT; throws Error(usage) naming `what`.
CaptureOptions parse_capture_spec(std::string_view text, std::string_view what);

struct MirrorOptions {
    Endpoint listen;                       // unused with `capture`
    std::optional<CaptureOptions> capture; // capture instead of proxying
    std::optional<Endpoint> production;    // duplicator: the real service
    std::vector<Endpoint> debug;           // duplicator: the debug copies (none: proxy only)
    std::optional<Endpoint> upstream;      // aggregator: the real backend
    std::optional<Endpoint> debug_listen;  // aggregator: where the debug copy's outbound connections arrive
    std::size_t buffer = 4 << 20;          // per connection, toward the debug side
    std::size_t buffer_total = std::size_t(1) << 30;  // all connections together
    double debug_linger_s = 30;            // how long a debug leg may finish after its client left
    Protocol divergence = Protocol::off;
    DivergenceRules rules = DivergenceRules::defaults();
    std::string record_path;               // client->server and production's replies (see recording.h)
    std::optional<Endpoint> stats;
    int control_fd = -1;                   // commands from a supervisor (MirrorCommand), answered there
    // Capture: hold every connection's bytes (no debug copy yet) until the
    // `release` command; `checkpoint` marks where the clone's copy starts.
    bool hold = false;
    std::string hook_socket;               // a Unix socket taking MirrorCommands too (the CRIU hook)
    bool json = false;   // ready line and final stats as JSON on stdout
    bool quiet = false;  // no per-event log lines on stderr
};

// What the proxy reports once it listens (ports resolved when 0 was asked).
struct MirrorReady {
    std::optional<Endpoint> listen;  // proxy modes
    std::string capture;             // capture mode: "IFACE:PORT"
    std::optional<Endpoint> debug_listen;
    std::optional<Endpoint> stats;
};

// A supervisor's command on `control_fd`, one JSON line, answered with one
// MirrorCommandReply line.
struct MirrorCommand {
    enum class Kind {
        // Record connections opened from now on into `path` (empty: stop
        // recording).  Connections already open keep recording where they
        // started, so a recording holds whole connections only.
        record,
        // Capture with `hold`: production is frozen for a checkpoint now
        // (sent at CRIU's post-dump notification, include/iprobe/formats/checkpoint_hook.h):
        // read how far production has read each connection.
        checkpoint,
        // Capture with `hold`: the clone restored from that checkpoint is
        // ready.  Each connection is fed to it from the first request the
        // checkpoint did not include; what cannot be is in the reply.
        release,
    } kind = Kind::record;
    std::string path;
};
// A connection the clone is missing requests of, from the clone's start.
struct MissedConnection {
    std::uint32_t connection = 0;
    std::string client;
    std::uint64_t requests = 0;  // known to be missed (0: unknown how many)
    std::string reason;
};
struct MirrorCommandReply {
    bool ok = false;
    std::string error;
    std::uint64_t open_connections = 0;  // connections open now (in no new recording)
    double at_s = 0;                     // the mirror's uptime when the command took effect
    // checkpoint: production's connections read; release: connections fed to
    // the clone from the checkpoint on, requests skipped because the
    // checkpoint held them, and what the clone misses.
    std::uint64_t connections = 0, resumed = 0, skipped_requests = 0;
    std::vector<MissedConnection> missed;
};
std::string to_json(const MirrorCommand& command);
std::string to_json(const MirrorCommandReply& reply);
// Both throw Error(bad_input) on anything else.
MirrorCommand parse_mirror_command(std::string_view json);
MirrorCommandReply parse_mirror_command_reply(std::string_view json);

// Runs until SIGTERM/SIGINT; SIGUSR1 dumps the stats to stderr.  Throws Error
// for bad configuration (ports in use, unwritable record file).
void run_mirror(const MirrorOptions& options, const std::function<void(const MirrorReady&)>& on_ready);

// The readiness event, {"event":"listening","listen":...,"pid":N} (capture:
// {"event":"capturing","capture":"lo:6379",...}): printed with --json and
// written to --ready-fd, where a supervising tool waits for it.
std::string ready_event_json(const MirrorReady& ready, pid_t pid);
// Throws Error(bad_input) when `json` is not a readiness event.
MirrorReady parse_ready_event(std::string_view json);

}  // namespace iprobe::proxy
