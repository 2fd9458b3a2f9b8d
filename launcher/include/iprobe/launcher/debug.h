// `iprobe debug`: a live clone of production wired to a copy of its traffic,
// with probes on in the clone only (docs/design.md §1, §8).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "iprobe/hotpatch/hotpatch.h"

namespace iprobe::launcher {

struct DebugOptions {
    pid_t pid = -1;              // production's root process
    std::string container;       // or production's podman container (cloned with podman, see container.h)
    std::string listen;          // ADDR:PORT clients use (the mirror's); unused with `capture`
    bool capture = false;        // mirror production's traffic off the wire: clients keep their address
    std::string production;      // ADDR:PORT production listens on
    std::string probes;          // probe list for `iprobe attach` in the clone (empty: none)
    std::string functions;       // function glob for attach
    hotpatch::ValueOptions values;  // what the clones' probes record (--args, --retval, --backtrace)
    std::string when, min_duration;  // for which calls (--when, --min-duration; empty: every call)
    std::string buffer;          // mirror's per-connection buffer ("4M"); empty: mirror's default
    std::string name;            // clone name; default iprobe-debug-PID
    // The mirror's reply comparison: stream|resp|http|off, or auto: resp or
    // http when the service is one whose protocol is known (redis, nginx, ...),
    // else off (stream with --recloning on-divergence).
    std::string divergence = "auto";
    enum class Recloning { off, on_overflow, on_divergence, periodic } recloning = Recloning::off;
    int period_s = 0;            // periodic re-cloning interval
    bool json = false;           // JSON lines on stdout, the clone's trace included ({"event":"trace",...})
    bool trace = true;           // stream the clones' events (off: aggregates only, in the reports)
    bool lossless = false;       // every event: a clone's thread whose ring is full waits for
                                 // its agent instead of dropping (the clone falls behind, not production)
    // Budget-limited instrumentation (docs/debug-window.md): the costliest
    // probed functions are turned off as a clone falls behind production's
    // traffic and back on as it catches up.
    bool adapt = false;
    // Clones of one checkpoint, each fed the whole stream; the probed
    // functions are split among them so each carries 1/N of the cost.
    int clones = 1;
    // Retro-logging: each generation's checkpoint and the input from then
    // on, kept in this directory for `iprobe investigate` (retro.h).
    std::string record_dir;
    std::uint64_t record_max_bytes = std::uint64_t(1) << 30;
    // Active debugging: F=LIB.so[:SYMBOL], applied with `iprobe patch` in
    // the clones only; the mirror then lists every reply the patch changed.
    std::vector<std::string> patches;
};

// Runs until SIGINT/SIGTERM (or the mirror exits), then removes the clone,
// its namespace and the mirror; production is left as it was.  Returns the
// exit code.
int run_debug(const DebugOptions& options);

}  // namespace iprobe::launcher
