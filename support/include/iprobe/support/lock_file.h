// Per-target session locks of the tools (one attach/detach at a time, one
// trace reader at a time).
#pragma once

#include <string>

#include "iprobe/support/fd.h"

namespace iprobe {

// An exclusive flock on /run/iprobe/NAME (/tmp/iprobe-UID/NAME where
// /run/iprobe is not this user's own), held for the object's life.  The file is
// removed on release, so locks do not pile up one per process ever probed;
// a locker that opened a file just being removed notices (the path no longer
// names what it locked) and tries again.  Files named PID.* of processes that
// no longer exist (their holder was SIGKILLed) are removed by the next locker.
class LockFile {
public:
    // Throws Error(busy) with `busy_message` when another holder has it.
    LockFile(const std::string& name, const std::string& busy_message);
    ~LockFile();
    LockFile(const LockFile&) = delete;
    LockFile& operator=(const LockFile&) = delete;

private:
    std::string path_;
    UniqueFd fd_;
};

}  // namespace iprobe
