// iprobe debug's session, internal to the launcher (debug.cpp): its life and
// signals, the checkpoints, re-cloning, the end.  What it runs is in three
// parts, each with its own file and tests: the mirror (MirrorSupervisor,
// mirror_supervisor.h), the clones of each generation with their probe
// agents and traces (CloneGeneration, clone_generation.h) and the record
// ring (SessionRecording, record_ring.h).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "client_pinger.h"
#include "clone_guardian.h"
#include "name_claim.h"
#include "iprobe/launcher/clone_generation.h"
#include "iprobe/launcher/debug.h"
#include "iprobe/launcher/mirror_supervisor.h"
#include "iprobe/launcher/record_ring.h"
#include "iprobe/launcher/session_events.h"
#include "iprobe/support/fd.h"

namespace iprobe::launcher {

class DebugSession {
public:
    explicit DebugSession(DebugOptions o);
    ~DebugSession() { teardown(); }

    int run();

private:
    double now_s() const {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
    }
    void event(const std::string& what, const std::string& human,
               const std::function<void(JsonWriter&)>& fields = {}) const {
        events_(what, human, fields);
    }
    void make_generation();
    void make_container_clone();
    void start_mirror();
    void switch_recording(const std::string& path);
    void release_held_connections();
    void trim_recording();
    // Why the clones should be re-made now ("": no need), by --recloning;
    // the mirror's counters the last decision saw are kept below.
    std::string reclone_reason(double last_clone_ms);
    void say_stopping(int stop_signal, const std::optional<std::string>& final_stats);
    void teardown();
    // Around a checkpoint: production's freeze as a client sees it (a RESP
    // service only); -1 when not measured.
    void start_client_view();
    double end_client_view();
    std::string divergence_mode() const;

    DebugOptions o_;
    SessionEvents events_;
    std::string name_, mirror_tool_;
    std::size_t changes_said_ = 0;  // the mirror's reports already said as "changed" events
    std::string service_ip_;        // production's listening address, as the clone has it too
    int port_ = 0;
    std::chrono::steady_clock::time_point started_;
    // Only this process holds the write end (close-on-exec: not the mirror
    // or the tracer): if it is killed, even with SIGKILL, the clones end.
    UniqueFd lifeline_read_, lifeline_write_;
    MirrorSupervisor mirror_;
    // --capture: the mirror captures from before the first checkpoint and
    // holds every connection until that clone is ready (hook_socket_: where
    // CRIU's post-dump hook tells it production is frozen).
    std::string hook_socket_;
    bool hold_pending_ = false;
    // --container: the session's name, claimed at its first clone and
    // released after everything else (name_claim.h).
    std::optional<clone_steps::NameClaim> container_claim_;
    std::unique_ptr<CloneGeneration> clones_;
    std::unique_ptr<SessionRecording> recording_;  // --record
    std::unique_ptr<ClientPinger> pinger_;         // a client of production's own (RESP services)
    // --container: armed before the clone container is made and held until
    // the session removed it (teardown): a container clone has no keeper to
    // end it when the session is killed outright, so its guardian removes it.
    std::optional<clone_steps::CloneGuardian> container_guardian_;
    long long overflows_seen_ = 0, diverged_seen_ = 0;
};

}  // namespace iprobe::launcher
