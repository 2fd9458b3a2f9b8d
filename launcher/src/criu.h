// Internal: the checks and the kept log every way of cloning shares; CRIU
// itself is driven through iprobe/launcher/criu_rpc.h.
#pragma once

#include <string>

#include "iprobe/launcher/criu_rpc.h"

namespace iprobe::launcher {

// Throws Error(permission) naming `what` unless running as root.
void require_root(const char* what);

// Throws Error(usage) unless `name` is a usable clone name (letters, digits,
// '-', '_', '.', at most 64, not starting with '.').
void validate_name(const std::string& name);

// Keeps a CRIU log from a directory about to be removed as
// /tmp/iprobe-clone-NAME-STEP.log; returns "\n  full log: PATH" for an
// error message, or "" when it could not be copied.
std::string keep_criu_log(const std::string& log_path, const std::string& name, const char* step);

}  // namespace iprobe::launcher
