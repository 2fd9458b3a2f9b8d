// iprobe debug's session, internal to the launcher: debug.cpp holds the
// session's life, the mirror, --record and --adapt; debug_generation.cpp each
// generation of clones, their probes and traces.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "client_pinger.h"
#include "clone_probes.h"
#include "iprobe/launcher/adapt_controller.h"
#include "iprobe/launcher/clone.h"
#include "iprobe/launcher/container.h"
#include "iprobe/launcher/debug.h"
#include "iprobe/launcher/retro.h"
#include "iprobe/proxy/address.h"
#include "iprobe/proxy/stats.h"
#include "iprobe/support/fd.h"
#include "iprobe/support/json.h"
#include "iprobe/support/proc.h"
#include "probe_cost.h"
#include "session_events.h"
#include "session_report.h"

namespace iprobe::launcher::debug_session {

std::string libexec_tool(const std::string& name);
int port_of(const std::string& addr, const char* what);
// /30s in 10.213.0.0/16 that no interface here uses: .1 host, .2 clone.
std::vector<int> pick_subnets(int count);
std::string subnet_addr(int subnet, int host);
// The mirror's counters; nullopt while it does not answer.
std::optional<proxy::MirrorStats> mirror_stats(const proxy::Endpoint& at);
using launcher::protocol_of_service;  // client_pinger.h
std::string joined(const std::vector<std::string>& items, std::size_t max = SIZE_MAX);
std::string percent(double share);

// The CPU share of a process's busiest thread between two samples: how
// much idle time a single-threaded service (or its busiest worker) has left.
class BusiestThread {
public:
    double sample(pid_t pid, double t_s) {
        std::map<pid_t, double> now;
        const double tick = static_cast<double>(::sysconf(_SC_CLK_TCK));
        for (pid_t tid : proc::threads(pid)) {
            const auto user = proc::stat_field(pid, 14, tid), sys = proc::stat_field(pid, 15, tid);
            if (user && sys) now[tid] = (std::stod(*user) + std::stod(*sys)) / tick;
        }
        double busiest = 0;
        if (last_t_ >= 0 && t_s > last_t_)
            for (const auto& [tid, cpu] : now)
                if (auto it = last_.find(tid); it != last_.end())
                    busiest = std::max(busiest, (cpu - it->second) / (t_s - last_t_));
        last_ = std::move(now);
        last_t_ = t_s;
        return std::min(busiest, 1.0);
    }

private:
    std::map<pid_t, double> last_;
    double last_t_ = -1;
};

// One clone of the current generation and what runs with it.
struct Clone {
    int index = 0;
    std::string name, veth, debug_address;
    int subnet = 0;
    bool alive = false;
    CloneResult clone;
    std::unique_ptr<CloneProbes> probes;
    std::vector<std::string> functions;  // symbols it probes (empty: the user's selector as given)
    std::unique_ptr<AdaptController> adapt;
    ProbeTimeline timeline;
    BusiestThread cpu;
    bool tracing = false;        // its agent streams the trace to us
    bool process_gone_said = false;  // its process exited, and the session said so
};

class DebugSession {
public:
    explicit DebugSession(DebugOptions o);
    ~DebugSession() { teardown(); }

    int run();

private:
    bool probing() const { return !o_.probes.empty() || !o_.functions.empty(); }
    double now_s() const {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
    }
    void event(const std::string& what, const std::string& human,
               const std::function<void(JsonWriter&)>& fields = {}) const {
        events_(what, human, fields);
    }
    std::string clone_label(const Clone& c) const {
        return o_.clones > 1 ? "clone " + std::to_string(c.index + 1) + " (" + c.name + ")" : "clone " + c.name;
    }
    void prepare_probes();
    // Selects --functions from `sources`, once: the names every clone's agent is handed.
    void select_functions(std::vector<std::string> sources);
    void make_generation();
    void make_container_clone();
    void connect_clone(Clone& c);
    // The clone's one probe agent, started at the first need (probes, patches).
    CloneProbes& agent_of(Clone& c, pid_t pid_in_clone, const std::vector<std::string>& in_clone);
    void attach_probes(Clone& c, pid_t pid_in_clone, const std::vector<std::string>& in_clone);
    void drop_generation();
    void remove_clones();
    void report_generation();
    void start_mirror();
    void switch_recording(const std::string& path);
    void release_held_connections();
    void teardown();
    void stop_child(pid_t& pid, int sig, bool group = false);
    // Writes what the clone's agent sent of its trace; false once the agent is gone.
    bool relay_trace(Clone& c);
    void stop_traces();
    void adapt_tick();
    void trim_recording();
    // Around a checkpoint: production's freeze as a client sees it (a RESP
    // service only); -1 when not measured.
    void start_client_view();
    double end_client_view();
    void say_client_seen(double client_seen_us) const {
        if (client_seen_us >= 0 && !o_.json)
            std::fprintf(stderr, "iprobe debug: a client of production waited at most %.1f ms for a reply meanwhile "
                                 "(a PING every 1 ms)\n",
                         client_seen_us / 1e3);
    }
    std::string divergence_mode() const;
    std::vector<std::vector<std::string>> split_functions() const;

    DebugOptions o_;
    SessionEvents events_;
    std::string name_, mirror_tool_, hotpatch_tool_;
    std::vector<hotpatch::FunctionPatch> patches_;  // --patch (clones only)
    std::size_t changes_said_ = 0;         // the mirror's reports already said as "changed" events
    std::string service_ip_;  // production's listening address, as the clone has it too
    int port_ = 0, stats_port_ = 0;
    proxy::Endpoint stats_at_;  // the mirror's, as it reported when ready
    std::vector<Clone> clones_;
    ContainerCloneResult container_clone_;  // --container: the clone is a podman container
    bool have_container_clone_ = false;
    pid_t mirror_ = -1;
    // --capture: the mirror captures from before the first checkpoint and
    // holds every connection until that clone is ready (hook_socket_: where
    // CRIU's post-dump hook tells it production is frozen).
    std::string hook_socket_;
    bool hold_pending_ = false;
    UniqueFd mirror_out_;
    UniqueFd mirror_control_;  // our end of the mirror's --control-fd socket
    // Only this process holds the write end (close-on-exec: not the mirror
    // or the tracer): if it is killed, even with SIGKILL, the clone ends.
    UniqueFd lifeline_read_, lifeline_write_;
    int generation_ = 0;
    double generation_start_s_ = 0;
    std::chrono::steady_clock::time_point started_;
    // --adapt and --clones: the selected functions by symbol, what one of
    // their events costs, and (after a generation) what each cost then.
    std::vector<std::string> probe_sources_;
    std::vector<std::string> functions_;
    ProbeCost cost_;
    std::map<std::string, double> measured_cost_;
    // --record
    std::unique_ptr<RecordRing> ring_;
    GenerationInfo recording_;
    bool recording_on_ = false;
    std::unique_ptr<ClientPinger> pinger_;  // a client of production's own (RESP services)
    double last_trim_s_ = 0;
};

}  // namespace iprobe::launcher::debug_session
