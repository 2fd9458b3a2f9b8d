// Active debugging (docs/active-debugging.md): `iprobe patch` applied in a
// clone only (`iprobe debug --patch`, `iprobe investigate --patch`), and
// the replies it changed, as the mirror's or the replay's divergence
// checker found them.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "clone_probes.h"
#include "iprobe/hotpatch/live_patch.h"
#include "iprobe/proxy/stats.h"
#include "iprobe/support/json.h"
#include "iprobe/launcher/session_events.h"

namespace iprobe::launcher {

// The patches of specs F=LIB.so[:SYMBOL], the library made absolute (the
// clone's agent runs in the clone's mount namespace).  Throws Error(usage)
// for a malformed spec, Error(not_found) for a library that is not there.
std::vector<hotpatch::FunctionPatch> patch_requests(const std::vector<std::string>& specs);

// Applies `patches` through the clone's probe agent and says what it did.
// Throws Error(failure) with the agent's message when it refuses or fails.
void patch_clone(const SessionEvents& say, CloneProbes& agent, const std::string& label,
                 const std::vector<hotpatch::FunctionPatch>& patches);

// The changed replies of `d` from report `from` on, one "changed" event
// each; returns how many reports it has said.
std::size_t say_changes(const SessionEvents& say, const proxy::DivergenceStats& d, std::size_t from, const char* copy);

// The patch's effect in total: replies compared, how many changed, on how
// many connections; in JSON the changed ones too (at most the checker's 100).
void say_patch_effect(const SessionEvents& say, const proxy::DivergenceStats& d);

}  // namespace iprobe::launcher
