// Active debugging (docs/active-debugging.md): `iprobe patch` applied in a
// clone only (`iprobe debug --patch`, `iprobe investigate --patch`), and
// the replies it changed, as the mirror's or the replay's divergence
// checker found them.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "iprobe/proxy/stats.h"
#include "iprobe/support/json.h"
#include "session_events.h"

namespace iprobe::launcher {

// The `iprobe patch` arguments (--function F --with LIB.so[:SYMBOL] ...) for
// specs F=LIB.so[:SYMBOL], the library made absolute (the tool runs in the
// clone's mount namespace).  Throws Error(usage) for a malformed spec,
// Error(not_found) for a library that is not there.
std::vector<std::string> patch_arguments(const std::vector<std::string>& specs);

// Runs `iprobe patch PID ...` through `in_clone` (nsenter into the clone's
// PID and mount namespaces, or nothing) and says what it did.  Throws
// Error(failure) with the tool's message when it refuses or fails.
void patch_clone(const SessionEvents& say, const std::string& hotpatch_tool, const std::vector<std::string>& in_clone,
                 pid_t pid_in_clone, pid_t host_pid, const std::string& label, const std::vector<std::string>& arguments);

// The changed replies of `d` from report `from` on, one "changed" event
// each; returns how many reports it has said.
std::size_t say_changes(const SessionEvents& say, const proxy::DivergenceStats& d, std::size_t from, const char* copy);

// The patch's effect in total: replies compared, how many changed, on how
// many connections; in JSON the changed ones too (at most the checker's 100).
void say_patch_effect(const SessionEvents& say, const proxy::DivergenceStats& d);

}  // namespace iprobe::launcher
