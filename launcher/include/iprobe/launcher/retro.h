// Retro-logging (docs/debug-window.md): `iprobe debug --record DIR` keeps,
// for each generation of clones, production's checkpoint and the client
// input from then on; `iprobe investigate DIR` restores a fresh clone from
// a generation's checkpoint, turns on probes nobody thought of at the time,
// and replays that input into it.
//
//   DIR/gen-000001/checkpoint/    clone.h's Checkpoint
//   DIR/gen-000001/input.rec      `iprobe mirror --record` (client bytes and
//                                 production's replies) of the connections
//                                 opened after the checkpoint
//   DIR/gen-000001/generation.json
//
// The ring is bounded: the oldest generations go when DIR would exceed its
// size; a generation alone larger than that stops recording its input.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "iprobe/hotpatch/hotpatch.h"

namespace iprobe::launcher {

struct GenerationInfo {
    int generation = 0;
    std::string dir;
    double started_at_s = 0;  // CLOCK_REALTIME seconds (the checkpoint)
    std::string service;      // ADDR:PORT the service listens on, in production and in a clone
    std::string protocol;     // reply comparison: resp, http, stream or off
    // Connections open when the recording switched to this generation: in
    // production's state after the checkpoint, but not in this input.
    std::uint64_t open_at_start = 0;
    bool complete = false;    // the input was recorded to the generation's end (not cut by --max-size)
};

class RecordRing {
public:
    // Creates `dir` (or takes one holding only generations).
    RecordRing(std::string dir, std::uint64_t max_bytes);

    // A new generation's directory, numbered after the newest there.
    GenerationInfo begin(const std::string& service, const std::string& protocol);
    void save(const GenerationInfo& g) const;
    // Removes the oldest generations while the ring is over its size (never
    // the current one).  True when the current one alone is over it: its
    // recording must stop.
    bool trim(const GenerationInfo& current);

    const std::string& dir() const { return dir_; }
    std::uint64_t max_bytes() const { return max_bytes_; }

private:
    std::string dir_;
    std::uint64_t max_bytes_;
};

std::vector<GenerationInfo> list_generations(const std::string& dir);
std::string input_path(const GenerationInfo& g);       // DIR/gen-N/input.rec
std::string checkpoint_path(const GenerationInfo& g);  // DIR/gen-N/checkpoint

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
