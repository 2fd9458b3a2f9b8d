// The steps of a live clone (clone.cpp), shared by the local clone and the
// remote one (remote.cpp): the checks on production's process tree, the
// checkpoint, the file snapshots, and the keeper that restores a checkpoint
// as PID 1 of a new PID namespace.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "criu.h"
#include "iprobe/launcher/clone.h"

namespace iprobe::launcher {

struct KeeperPlan {
    std::string criu;
    std::string images;
    std::string restore_log;
    std::vector<std::pair<std::string, std::string>> binds;  // copy -> original path
    bool shell_job = false;
    std::string name;
    std::string images_mount;  // where the keeper binds `images` (in the state directory)
    int lifeline_fd = -1;      // CloneOptions::lifeline_fd
    // What pins the clone on the host, removed by the keeper itself when the
    // launcher that asked for it is gone without removing it (killed
    // outright): the state directory, the network namespace's mount in
    // /run/netns when the restore made it, a scratch checkpoint ("" if kept).
    std::string state_dir;
    bool created_netns = false;
    std::string scratch_checkpoint;
};

namespace clone_steps {

// ---- the clone's orchestration (clone.cpp)
void progress(const CloneOptions& o, const std::string& line);
std::string fmt_ms(double v);

// What every way of cloning PID checks before touching it (root, the process
// exists); returns the clone's name, o.name or iprobe-clone-PID, validated.
std::string checked_clone_name(const CloneOptions& o, const char* command);
// Checkpoints production (criu_dump), telling the mirror at
// o.frozen_hook_socket while CRIU holds it frozen; `page_server_fd`: a
// connection to a page server the memory goes to.  Returns the wall time
// and CRIU's statistics; throws with CRIU's message, production resumed.
struct Dumped {
    double dump_ms = 0;
    DumpStats stats;
};
Dumped dump_production(const CloneOptions& o, const Criu& criu, const std::string& name, size_t processes,
                       const std::string& images, const std::string& dump_log, bool& shell_job,
                       int page_server_fd = -1);

// ---- the process tree (pstree.cpp)
std::string readlink_str(const std::string& path);

std::vector<pid_t> process_tree(pid_t root);

// Field 22 of /proc/PID/stat: identifies a process across PID reuse.
std::string start_time(pid_t pid);

pid_t session_of(pid_t pid);

// CRIU refuses such a tree only after freezing it, so it is refused here,
// before production is touched.
void require_visible_session_leaders(const std::vector<pid_t>& tree);
// A process there is something to clone of: not a zombie, not a kernel thread.
void require_user_process(pid_t pid);

// A terminal open in the tree (a service started from an interactive shell
// keeps its stdio on the shell's pty) makes CRIU's restore fail after the
// freeze: the pty's index is taken on this host and its master is not in the
// tree.  Refused before anything is frozen, with the way out.
void require_no_terminal(const std::vector<pid_t>& tree);

// Running, not a zombie waiting for a parent (the keeper's is init, which
// may reap late).
bool alive(pid_t pid);

// `pid` is alive and is the process that started at `started` (start_time()),
// not a later one given its PID.
bool still_running(pid_t pid, const std::string& started);

pid_t find_clone_root(pid_t keeper, pid_t pid_in_ns);

// Keepers living in the network namespace at `netns_path`: found this way
// when the launcher was killed before it could record its keeper.
std::vector<pid_t> keepers_in(const std::string& netns_path);

bool same_ns(pid_t pid, const char* type);

// ---- file-system snapshot (snapshot.cpp)
// `path` is `dir` or below it.
bool under(const std::string& path, const std::string& dir);
// Files the clone must not share with production: explicit paths, plus
// regular files any process of the tree has open for writing and their
// working directories (when of a sensible size).
std::vector<std::string> snapshot_paths(const CloneOptions& o, const std::vector<pid_t>& tree);

// ---- recorded state (state.cpp)
inline const char* const kStateRootParent = "/run/iprobe";

inline const char* const kStateRoot = "/run/iprobe/clones";
// Each container clone's record (container.cpp), each --to clone's note
// (remote.cpp), each clone name's claim while its clone is made (name_claim.h).
inline const char* const kContainerStateRoot = "/run/iprobe/container-clones";
inline const char* const kRemoteRoot = "/run/iprobe/remote-clones";
inline const char* const kClaimRoot = "/run/iprobe/claims";

std::string state_dir(const std::string& name);

using State = std::map<std::string, std::string>;

// A State as `key=value` lines in the file `path`, written atomically; read
// back (nullopt when there is no such file).
void write_state_file(const std::string& path, const State& st);
std::optional<State> read_state_file(const std::string& path);

void save_state(const std::string& name, const State& st);

State read_state(const std::string& name);

pid_t to_pid(const std::string& s);

void record_state(const CloneResult& r, bool created_netns, const std::string& keeper_started, pid_t source);

// Before anything of clone `name` is made (its state directory is the first):
// who makes it, this launcher and its guardian (clone_guardian.h), so that
// a second launcher does not take it for remains while either lives.
void record_making(const std::string& name, pid_t guardian, const std::string& guardian_start);

// The state was recorded by this very process (record_making).
bool made_here(const State& st);

// Before the namespace is made: what `iprobe clone --destroy` and the
// guardian need to remove the remains should this launcher be killed before
// record_state() (which keeps the guardian's PID too).
void record_restoring(const std::string& name, const std::string& netns_path, bool created_netns);

// The launcher making clone `name`, or its guardian, still runs.
bool being_restored(const State& st);

// The process whose PID and start time `st` keeps under these keys still runs.
bool alive_as_recorded(const State& st, const char* pid_key, const char* start_key);

// Where clone_process keeps its checkpoint until the restore is done.
std::string scratch_checkpoint_dir(const std::string& name);

void remove_tree(const std::string& path);

// ---- what a launcher killed outright left (clone.cpp, for clone_guardian.cpp)
// Removes clone `name` as `--destroy` does (keeper, veth, namespace it made,
// state), unless its state names a guardian other than `guardian`.
void remove_guarded_clone(const std::string& name, pid_t guardian);

// ---- what a container clone's launcher killed outright left (container.cpp)
struct PodmanObject {
    std::string kind;  // "container", "network" or "volume"
    std::string name;
};
// `podman KIND rm --force NAME` for each: the containers first (a network or
// volume in use by one is not removed).
void remove_guarded_podman(const std::vector<PodmanObject>& objects);

// ---- the clone's PID 1 (keeper.cpp)
// Starts the keeper inside `netns`; returns its host PID once CRIU has
// restored the clone, or throws with CRIU's reasons.
pid_t start_keeper(const KeeperPlan& plan, const std::string& netns_path);

void kill_keeper(pid_t keeper, const std::string& started);

}  // namespace clone_steps
}  // namespace iprobe::launcher
