// `iprobe debug --adapt`: which probed functions a clone keeps on, decided
// from how far behind production's traffic the clone is (docs/debug-window.md).
//
// The controller is pure: the session feeds it observations (the mirror's
// buffer fill and lag for this clone, the clone's per-function call counts
// from its region, its busiest thread's CPU share, the arrival rate) and
// applies its decisions (detach or attach functions in the clone).
//
//  - A function's cost is measured, not assumed: its entry and exit events
//    in the last interval (the runtime's exact counts) times the cost of one
//    such event on this machine (probe_cost.h), as a share of a CPU; kept
//    per byte of arriving traffic, so it can be predicted at another load.
//  - Falling behind (fill or lag above the high marks, or the lag growing
//    past the low mark, or the buffer filling at a rate that overflows it
//    within the horizon): the costliest functions go first, until the cost
//    gone is what the clone needs to keep up with room to drain its backlog
//    (from how much of the arriving traffic it processes now), and at least
//    half of the instrumentation cost (a multiplicative decrease); then a
//    cooldown, so the effect is seen before more goes (unless the buffer is
//    nearly full).
//  - Caught up (fill and lag below the low marks) for a calm period: the
//    cheapest dropped functions come back, as many as the clone's measured
//    idle time pays for with headroom (an increase bounded by measurement),
//    and in steps: at most a share of those dropped at a time, a share that
//    doubles while restores hold and halves when one did not (at
//    saturation, predicted costs are too low to trust: a clone that could
//    not carry any probe got all of them back at once, and lost them all).
//  - No flapping: a drop soon after a restore doubles the calm period
//    (up to a limit); a long quiet time resets it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace iprobe::launcher {

struct AdaptConfig {
    double high_fill = 0.5, low_fill = 0.1;        // shares of the per-connection buffer
    double high_lag_ms = 2000, low_lag_ms = 200;   // the clone's lag behind production
    double panic_fill = 0.8;                       // drop again at once, cooldown or not
    double horizon_s = 3;                          // a buffer overflowing sooner than this is falling behind
    double lag_trend = 0.05;                       // lag growing faster than this (s/s) is falling behind
    double drain_load = 0.8;                       // the clone's load to aim for while it has a backlog
    double shed_share = 0.5;                       // of the instrumentation cost, per drop
    double cooldown_s = 1;                         // between drops
    double calm_s = 2;                             // caught up this long before a restore
    double max_calm_s = 60;
    double headroom = 0.5;                         // restore what fits in this share of idle time
    // Stepwise restore: at most this share of the dropped functions per
    // restore (never fewer than restore_min); doubled after a restore that
    // held, halved after one the clone could not carry.
    double restore_share = 0.25;
    std::size_t restore_min = 8;
};

// Per function, cumulative: entry events (calls) and exit events (completed).
struct FunctionEvents {
    std::uint64_t entries = 0, exits = 0;
};

struct AdaptObservation {
    double t_s = 0;                       // the session's clock
    double fill = 0;                      // worst connection's share of its buffer, for this clone
    double lag_ms = 0;                    // worst lag behind production, for this clone
    double arrival_bytes = 0;             // cumulative client->production bytes
    double fed_bytes = 0;                 // cumulative bytes the mirror sent this clone
    double busy = 0;                      // busiest thread's CPU share since the last observation
    std::vector<FunctionEvents> events;   // by function index, cumulative
};

struct AdaptDecision {
    enum class Action { none, drop, restore } action = Action::none;
    std::vector<std::size_t> functions;  // indices
    std::string reason;
    double cost = 0;                     // CPU share they cost (drop: measured; restore: predicted)
};

class AdaptController {
public:
    // `entry_ns` and `exit_ns`: the measured cost of one event (probe_cost.h).
    AdaptController(std::size_t functions, double entry_ns, double exit_ns, AdaptConfig config = {});

    AdaptDecision observe(const AdaptObservation& o);
    // The session carried the decision out (a failed one is not applied).
    void applied(const AdaptDecision& d, double t_s);

    bool on(std::size_t f) const { return on_[f]; }
    std::size_t on_count() const;
    std::size_t size() const { return on_.size(); }
    double cost(std::size_t f) const { return cost_[f]; }  // CPU share, last measured while on
    double total_cost() const;                             // of the functions on
    double calm_s() const { return calm_s_; }
    double restore_step() const { return step_share_; }  // share of the dropped a restore may bring back

private:
    void measure(const AdaptObservation& o);
    bool falling_behind(const AdaptObservation& o) const;
    AdaptDecision drop(const AdaptObservation& o);
    AdaptDecision restore(const AdaptObservation& o);
    double next_step_share() const;

    AdaptConfig c_;
    double entry_ns_, exit_ns_;
    std::vector<bool> on_;
    std::vector<double> cost_;           // share of a CPU, while on
    std::vector<double> cost_per_byte_;  // the same per arriving byte per second
    std::vector<bool> measured_;
    AdaptObservation last_;
    bool have_last_ = false;
    double arrival_rate_ = 0;            // bytes/s, last interval
    double keeping_up_ = 1;              // share of the arriving traffic the clone processes, last interval
    double lag_rate_ = 0, fill_rate_ = 0;  // growth per second, last interval
    double busy_ = 0;
    double calm_since_ = -1;             // when fill and lag last went below the low marks
    double last_drop_ = -1e9, last_restore_ = -1e9;
    double calm_s_;
    double step_share_;
};

}  // namespace iprobe::launcher
