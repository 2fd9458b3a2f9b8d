// `iprobe debug`'s mirror (docs/design.md §8): the iprobe-mirror child and
// its channels for the session's life.  Its stdout (a pipe) says what it
// does, for people; its readiness, and where its stats are, come on its fd 3
// as one JSON event (proxy::MirrorReady); fd 4 is a socket it takes commands
// on (proxy::MirrorCommand, one JSON line each, answered likewise).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "iprobe/proxy/address.h"
#include "iprobe/proxy/mirror.h"
#include "iprobe/proxy/stats.h"
#include "iprobe/support/fd.h"

namespace iprobe::launcher {

class MirrorSupervisor {
public:
    MirrorSupervisor() = default;
    ~MirrorSupervisor() { stop(); }
    MirrorSupervisor(const MirrorSupervisor&) = delete;
    MirrorSupervisor& operator=(const MirrorSupervisor&) = delete;

    // Starts `argv` (the mirror tool and its arguments; --control-fd is
    // added) in a process group of its own, so that a terminal's Ctrl-C
    // reaches the session only, and waits for its readiness.  Throws with
    // the mirror's exit code when it ends first, or reports no stats.
    void start(std::vector<std::string> argv);
    bool started() const { return pid_ > 0; }
    pid_t pid() const { return pid_; }
    const proxy::Endpoint& stats_endpoint() const { return stats_at_; }

    // What the mirror wrote for people: poll output_fd(), then relay_output()
    // copies it to `to` (-1: read and dropped).
    int output_fd() const { return out_.get(); }
    void relay_output(int to);

    // Its counters, parsed, or the document as it serves it; nullopt while
    // it does not answer (2 s).
    std::optional<proxy::MirrorStats> stats() const;
    std::optional<std::string> stats_document() const;

    // Records the connections opened from now on into `path` ("" stops);
    // returns the connections open then (in no new recording).
    std::uint64_t record(const std::string& path);
    // Feeds each connection held since before a checkpoint to the debug
    // copies from the first request the checkpoint did not hold (--capture).
    proxy::MirrorCommandReply release();

    // Once the mirror ended by itself, how ("exited with 1", "was killed by
    // signal Killed"), once; nullopt while it runs.
    std::optional<std::string> ended();
    // SIGTERM, then SIGKILL after 3 s; waits for it.
    void stop();

private:
    proxy::MirrorCommandReply command(const proxy::MirrorCommand& c, const std::string& what);

    pid_t pid_ = -1;
    UniqueFd out_, control_;
    proxy::Endpoint stats_at_;
};

}  // namespace iprobe::launcher
