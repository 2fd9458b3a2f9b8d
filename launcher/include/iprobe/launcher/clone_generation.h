// `iprobe debug`'s clones, one generation after another (docs/design.md §8,
// docs/debug-window.md): each generation restores one checkpoint of
// production once per clone, connects each clone to the mirror (a veth pair,
// NAT to where the service listens), starts its one probe agent for its
// patches and its share of the selected functions, relays its trace, steps
// --adapt, and reports what it measured when it ends.  The session around it
// (debug.cpp) takes the checkpoints and runs the mirror (MirrorSupervisor)
// and the record ring (SessionRecording).
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "iprobe/hotpatch/live_patch.h"
#include "iprobe/launcher/clone.h"
#include "iprobe/launcher/container.h"
#include "iprobe/launcher/debug.h"
#include "iprobe/launcher/session_events.h"
#include "iprobe/proxy/stats.h"

namespace iprobe::launcher {

// What every generation of a session shares.
struct CloneSetup {
    std::string name;           // the session's: clone i is NAME, NAME-2, NAME-3, ...
    std::string service_ip;     // where production listens, as each clone has it too
    int port = 0;
    std::string hotpatch_tool;  // iprobe-hotpatch, for probes or patches ("" without either)
    std::vector<hotpatch::FunctionPatch> patches;  // --patch, applied in every clone
    int lifeline_fd = -1;       // restore_clone's: the clones end with the session
    std::chrono::steady_clock::time_point started;  // the session's start: events' and timelines' t_s
};

// Each clone's share of `functions` (by raw symbol).  Without costs (the
// first generation) dealt out in list order; else balanced by what each cost
// in the previous generation (largest first, to the clone carrying least),
// so each clone carries about 1/N of the instrumentation.
std::vector<std::vector<std::string>> share_functions(const std::vector<std::string>& functions, std::size_t clones,
                                                      const std::map<std::string, double>& measured_cost);

class CloneGeneration {
public:
    CloneGeneration(const DebugOptions& options, CloneSetup setup, SessionEvents events);
    ~CloneGeneration();  // remove()
    CloneGeneration(const CloneGeneration&) = delete;
    CloneGeneration& operator=(const CloneGeneration&) = delete;

    // Selects --functions once, from --probes or production's executable
    // (a container's once its clone runs); with --adapt or --clones also
    // measures what a probed call costs.  Throws Error(not_found) when
    // nothing matches.
    void select_probes();
    // Where the mirror sends each clone's copy (ADDR:PORT; a container's is
    // known once it runs).
    std::vector<std::string> debug_addresses() const;

    // A generation starts (its number, its start for the report) ...
    void begin();
    int number() const;
    // ... with `checkpoint` restored once per clone, each connected, patched
    // and probed.  `scratch_checkpoint`: the checkpoint is the session's
    // scratch copy (removed with the clones should the session die).
    void restore(const Checkpoint& checkpoint, bool scratch_checkpoint, double client_seen_us);
    // ... or with the one clone podman made (--container).
    void adopt_container(const ContainerCloneResult& clone, double client_seen_us);

    // The probe agents' descriptors, to poll.
    std::vector<int> agent_fds() const;
    // Writes what the agents sent of their traces and says once of a clone
    // whose process exited; returns why another clone's agent ended ("":
    // none did).
    std::string pump();
    // --adapt: one controller step per clone, from the mirror's view of how
    // far behind each is.
    void adapt(const proxy::MirrorStats& stats);

    // The generation ends: its traces (what they still held written), its
    // report, its clones removed.
    void end();
    void stop_traces();
    void report();
    void remove();

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace iprobe::launcher
