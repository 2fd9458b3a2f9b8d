// The record ring (docs/debug-window.md): `iprobe debug --record DIR` keeps,
// for each generation of clones, production's checkpoint and the client
// input from then on, for `iprobe investigate` (retro.h).
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

// A debug session's side of the ring: the generation being recorded,
// whether the mirror records its input, and --max-size kept.  The session
// tells the mirror (MirrorSupervisor::record) and this what it did.
class SessionRecording {
public:
    SessionRecording(const std::string& dir, std::uint64_t max_bytes, std::string service, std::string protocol)
        : ring_(dir, max_bytes), service_(std::move(service)), protocol_(std::move(protocol)) {}

    // Closes the current generation (complete when its input was recorded
    // to the end) and begins the next.
    void next_generation();
    const GenerationInfo& current() const { return current_; }
    std::string checkpoint() const { return checkpoint_path(current_); }
    std::string input() const { return input_path(current_); }
    // The mirror records the current generation's input from now (or stopped),
    // `open` connections being open then.
    void switched(bool on, std::uint64_t open);
    // Connections the clones miss at the generation's start (the capture's).
    void set_open_at_start(std::uint64_t open) { current_.open_at_start = open; }
    bool recording() const { return on_; }
    void save() const { ring_.save(current_); }
    // While recording, at most once a second (`now_s`): whether the ring is
    // over --max-size with the current generation alone; its input must then
    // stop (stopped(): marked incomplete and saved).
    bool over_size(double now_s);
    void stopped();
    // The session ends: the current generation is complete when its input
    // was being recorded.
    void finish();

private:
    RecordRing ring_;
    std::string service_, protocol_;
    GenerationInfo current_;
    bool on_ = false;
    double last_check_s_ = 0;
};

}  // namespace iprobe::launcher
