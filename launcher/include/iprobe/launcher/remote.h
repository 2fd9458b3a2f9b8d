// A clone on a second host (docs/remote-clone.md).  `iprobe clone PID --to
// HOST:PORT` checkpoints production with CRIU streaming its memory straight
// to a CRIU page server the agent starts on the other host, then sends the
// agent the few remaining images and the clone's file snapshots over the
// agent's control connection; the agent restores the clone there, in its
// host's network namespace and a new PID namespace of its own.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "iprobe/launcher/clone.h"

namespace iprobe::launcher {

struct AgentOptions {
    std::string listen;     // ADDR:PORT for control connections; the page servers use ADDR too
    std::string state_dir;  // the agent's clones: images, snapshots, logs (one directory each)
    std::function<void(const std::string&)> progress;  // one line per event, may be empty
};

// Serves clone and destroy requests one at a time until SIGINT or SIGTERM,
// then destroys every clone it made: none outlives the agent.
void run_clone_agent(const AgentOptions& options);

// Clones options.pid to the agent at `agent` (HOST:PORT).  The result's
// PIDs are the agent host's; netns_path names the agent.  On any failure
// production runs on untouched and the agent keeps nothing.
CloneResult clone_to_agent(const CloneOptions& options, const std::string& agent);

// Kills a clone the agent at `agent` restored and removes what it kept.
void destroy_agent_clone(const std::string& agent, const std::string& name);

// What `iprobe clone --to` made, noted on production's host
// (/run/iprobe/remote-clones/NAME) for --list and --destroy.
struct RemoteCloneRecord {
    std::string agent;  // HOST:PORT
    CloneResult clone;  // as clone_to_agent returned it (that host's PIDs)
};
void record_remote_clone(const CloneResult& clone, const std::string& agent);
void forget_remote_clone(const std::string& name);
std::vector<RemoteCloneRecord> remote_clones();

// Clones the agents running on this host hold for other hosts (each agent
// notes itself in /run/iprobe/agents and each clone in its --state-dir).
struct AgentHeldClone {
    std::string agent;      // its --listen address
    std::string state_dir;  // the clone's directory there
    CloneResult clone;      // restore_ms and total_ms are the restore's; keeper_pid -1 when gone
};
std::vector<AgentHeldClone> agent_held_clones();

}  // namespace iprobe::launcher
