// Retro-logging (docs/debug-window.md): `iprobe debug --record DIR` keeps,
// for each generation of clones, production's checkpoint and the client
// input from then on; `iprobe investigate DIR` restores a fresh clone from
// a generation's checkpoint, turns on probes nobody thought of at the time,
// and replays that input into it.
//
// The ring's layout on disk and its bound: record_ring.h.
#pragma once

#include <string>
#include <vector>

#include "iprobe/hotpatch/hotpatch.h"
#include "iprobe/launcher/record_ring.h"

namespace iprobe::launcher {

struct InvestigateOptions {
    std::string dir;
    int generation = 0;        // 0: the newest
    std::string probes;        // probe lists (default: the service's executable)
    std::string functions;     // globs
    hotpatch::ValueOptions values;  // what the probes record (--args, --retval, --backtrace)
    std::string when, min_duration;  // for which calls (--when, --min-duration; empty: every call)
    double speed = 0;          // 0: as fast as possible; 1: the recorded pacing
    std::string compare = "auto";  // resp | http | stream | off | auto (the generation's)
    bool trace = false;        // stream the clone's events
    bool json = false;
    std::string name;          // the clone's; default iprobe-investigate-PID
    // F=LIB.so[:SYMBOL]: applied in the clone before the replay (`iprobe
    // patch`); every reply it changed is then listed.
    std::vector<std::string> patches;
};

// Restores, probes, replays, reports, removes the clone.  Returns the exit
// code: 0, or 1 when the replay's replies differed from production's.
int run_investigate(const InvestigateOptions& options);

}  // namespace iprobe::launcher
