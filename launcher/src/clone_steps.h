// The steps of a live clone (clone.cpp), shared by the local clone and the
// remote one (remote.cpp): the checks on production's process tree, the
// checkpoint, the file snapshots, and the keeper that restores a checkpoint
// as PID 1 of a new PID namespace.
#pragma once

#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

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
};

namespace clone_steps {

void progress(const CloneOptions& o, const std::string& line);
std::vector<pid_t> process_tree(pid_t root);
// Field 22 of /proc/PID/stat: identifies a process across PID reuse.
std::string start_time(pid_t pid);
pid_t session_of(pid_t pid);
bool alive(pid_t pid);
// Refusals made before production is frozen (see clone.cpp).
void require_visible_session_leaders(const std::vector<pid_t>& tree);
void require_no_terminal(const std::vector<pid_t>& tree);
// Files the clone must not share with production.
std::vector<std::string> snapshot_paths(const CloneOptions& o, const std::vector<pid_t>& tree);
// `criu dump --leave-running` of production (extra_args appended); returns
// the wall time in ms.  Throws with CRIU's reasons; production then runs on.
double dump_production(const CloneOptions& o, const Criu& criu, const std::string& name, size_t processes,
                       const std::string& images, const std::string& dump_log, bool& shell_job,
                       const std::vector<std::string>& extra_args);
// Starts the keeper inside the network namespace at `netns_path`; returns
// its PID once CRIU has restored the clone, or throws with CRIU's reasons.
pid_t start_keeper(const KeeperPlan& plan, const std::string& netns_path);
pid_t find_clone_root(pid_t keeper, pid_t pid_in_ns);
void kill_keeper(pid_t keeper, const std::string& started);
void remove_tree(const std::string& path);
std::string fmt_ms(double v);

}  // namespace clone_steps
}  // namespace iprobe::launcher
