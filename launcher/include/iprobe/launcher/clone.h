// Live clones of a running service (docs/design.md §8): CRIU checkpoints the
// service's process tree while it keeps running and restores the copy into
// its own network, PID and mount namespaces, with the files it writes
// snapshotted, so the copy can be probed without touching production.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

namespace iprobe::launcher {

// The criu executable `iprobe clone` uses and its version ("4.2.1").
struct Criu {
    std::string path;
    std::string version;
};

// $IPROBE_CRIU, else the private prefix scripts/setup.d/criu installs, else a
// system criu >= 4.2, found once per process.  Throws Error(unavailable)
// naming scripts/setup.
Criu find_criu();

struct CloneOptions {
    pid_t pid = -1;                         // root of the production process tree
    std::string name;                       // clone and network namespace; default iprobe-clone-PID
    std::vector<std::string> fs_snapshot;   // extra files/directories the clone gets copies of
    bool default_snapshots = true;          // also files open for writing and working directories
    std::string keep_images;                // keep CRIU's images here (default: removed after restore)
    std::function<void(const std::string&)> progress;  // one line per step, may be empty
    // The read end of a pipe whose write end only the caller holds: when
    // every write end is closed (the caller exited or was killed), the clone
    // ends itself.  -1: the clone lives until `iprobe clone --destroy`.
    int lifeline_fd = -1;
    // take_checkpoint: while CRIU holds production frozen after the dump, the
    // mirror listening on this Unix socket is told so (CRIU's post-dump
    // notification, include/iprobe/formats/checkpoint_hook.h), and production resumes once
    // it answered.  Empty: no hook.
    std::string frozen_hook_socket;
    // Measure the freeze as a client of production (RESP services): a PING
    // every 1 ms on a connection of its own while the checkpoint is taken.
    // Off by default: production serves those requests too.
    bool client_view = false;
};

// Timings are milliseconds.
struct CloneResult {
    std::string name;
    std::string netns_path;         // /run/netns/NAME
    pid_t clone_pid = -1;           // the clone's root process, as the host sees it
    pid_t clone_pid_in_ns = -1;     // ... and inside its PID namespace (= production's PID)
    pid_t keeper_pid = -1;          // PID 1 of the clone's PID namespace, as the host sees it
    double freeze_ms = 0;           // production frozen (CRIU frozen_time)
    double freezing_ms = 0;         // time CRIU took to stop production (CRIU freezing_time)
    double dump_ms = 0;             // criu dump, wall clock
    double restore_ms = 0;          // criu restore, wall clock
    double total_ms = 0;
    // The longest a client of production waited for a reply meanwhile (a
    // PING every 1 ms on a connection of its own; RESP services), -1 when
    // not measured.
    double client_seen_ms = -1;
    unsigned long long pages_written = 0;
    std::vector<std::string> snapshots;  // paths the clone sees as private copies
    std::string images_dir;              // empty unless kept
};

// Clones `options.pid`.  Production keeps running throughout; on any failure
// nothing is left behind and production is as it was (CRIU resumes it).  A
// clone of the same name whose processes are gone (its caller's lifeline
// closed) is removed first.
CloneResult clone_process(const CloneOptions& options);

// A checkpoint of production kept in a directory: CRIU's images and pristine
// copies of the files a clone gets private ones of.  Any number of clones
// can be restored from it, now or later (`iprobe debug --clones N` restores
// several of one checkpoint; `iprobe investigate` one from a recorded
// generation); each gets its own copies, the checkpoint stays as it was.
//
// DIR/checkpoint.json   what restore needs (below), written last
// DIR/images/           criu dump -D
// DIR/fs/N              copy of snapshots[N].original
struct Checkpoint {
    std::string dir;
    pid_t pid = -1;                       // production's root (the clone's PID inside its namespace)
    bool shell_job = false;
    std::vector<std::string> snapshots;   // original paths; copy N is DIR/fs/N
    std::vector<std::string> addresses;   // production's non-loopback addresses (restored on the clone's loopback)
    double freeze_ms = 0, freezing_ms = 0, dump_ms = 0;
    unsigned long long pages_written = 0;
    double taken_at_s = 0;                // CLOCK_REALTIME seconds when the dump finished
};

// Dumps options.pid into `dir` (created; must be empty or absent).
// Production keeps running; on failure `dir` is removed and production is as
// it was.  `options.name` names the logs; keep_images is not used.
Checkpoint take_checkpoint(const CloneOptions& options, const std::string& dir);
// Throws Error(not_found / bad_input) when `dir` holds no checkpoint.
Checkpoint load_checkpoint(const std::string& dir);

struct RestoreOptions {
    std::string name;                                  // clone and network namespace
    std::function<void(const std::string&)> progress;  // may be empty
    int lifeline_fd = -1;                              // as CloneOptions::lifeline_fd
    // The checkpoint is this restore's scratch copy: should the caller die
    // before it removes the clone, the clone's keeper removes it too.
    bool scratch_checkpoint = false;
};

// A clone of `checkpoint` named options.name, as clone_process makes one.
CloneResult restore_clone(const Checkpoint& checkpoint, const RestoreOptions& options);

// One thing `--destroy` removed: kind is "clone" (its keeper and every
// process of the clone), "netns", "veth", "state", "checkpoint",
// "container", "network"; what names it (a PID, a name, a path).
struct Removed {
    std::string kind;
    std::string what;
};

// Kills the clone's process tree and removes its namespace and copies, and
// whatever a launcher killed half-way left of clone `name`; returns what it
// removed.  Throws Error(not_found) when nothing of that name exists.
std::vector<Removed> destroy_clone(const std::string& name);

// Names of clones that exist (their state under /run/iprobe/clones).
std::vector<std::string> list_clones();

// Reads a clone's recorded state; throws Error(not_found).
CloneResult load_clone(const std::string& name);

// The network namespace a local clone `name` runs in (/run/netns/NAME).
std::string netns_path_of_clone(const std::string& name);

}  // namespace iprobe::launcher
