// The guardian of a clone being made (docs/debug-container.md, "Interrupted,
// it undoes itself"): a process forked before the launcher makes anything
// that would outlive it (a scratch checkpoint, the clone's state, its
// network namespace and veth, its keeper).  It holds one end of a socket
// pair whose other only the launcher (and, until they exec, its helpers)
// holds.  When that end closes without a release, the launcher was killed outright
// (SIGKILL) before it could record or remove what it made: the guardian
// waits until every helper it was told of has ended (CRIU finishing a dump
// and resuming production, an `ip netns add` or `cp` still running), then
// removes what the clones' state files say was made, the podman objects
// of a container clone (its container, network and volume copies), and the
// scratch checkpoints and records, drops the clone name's claim last
// (name_claim.h), and exits.  Internal to the launcher.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

namespace iprobe::launcher::clone_steps {

class CloneGuardian {
public:
    // Forks the guardian; from now on every helper the launcher starts
    // notes its PID to it (note_children_to, process.h).
    CloneGuardian();
    // Releases it (release()): on every way out but SIGKILL, the launcher
    // itself removes or records what it made.
    ~CloneGuardian();
    CloneGuardian(const CloneGuardian&) = delete;
    CloneGuardian& operator=(const CloneGuardian&) = delete;

    // Before anything of clone `name` is made (its state directory first):
    // the guardian removes it unless the clone's state names another
    // guardian by then.
    void guard_clone(const std::string& name);
    // Before `dir`, a scratch checkpoint (or a file: a record not yet
    // kept), is made.
    void guard_scratch(const std::string& dir);
    // Before podman makes `name` of a container clone, a `kind` of
    // PodmanObject (`podman container|network|volume rm --force NAME`
    // removes it).  Only ever a name the launcher found free just before.
    void guard_podman(const std::string& kind, const std::string& name);
    // When `name` is claimed for this launcher (name_claim.h): dropped by
    // the guardian after every removal, so that no other command makes a
    // clone of that name while it removes objects by name.
    void guard_claim(const std::string& name);
    // What was made is now recorded (a clone that outlives its command) or
    // removed by the launcher: the guardian exits without removing anything.
    void release();

    pid_t pid() const { return pid_; }
    // Its start time (start_time(), pstree.cpp): recorded with its PID.
    const std::string& started() const { return started_; }

    // The guardian this process has armed, or nullptr.
    static CloneGuardian* current();

private:
    void send(std::uint32_t kind, const std::string& payload);

    pid_t pid_ = -1;
    std::string started_;
    int socket_ = -1;  // the launcher's end
};

}  // namespace iprobe::launcher::clone_steps
