// What a probed call costs the traced process, measured here and now: the
// runtime's trace handler on iprobe-probe-cost's empty function, entry
// probe alone and entry and exit together, against the same loop unprobed.
// `iprobe debug --adapt` prices a function's probes as its calls times these.
#pragma once

#include <string>

namespace iprobe::launcher {

struct ProbeCost {
    double entry_ns = 0;    // one entry event (counted, logged)
    double exit_ns = 0;     // one exit event (timed, logged)
    double unprobed_ns = 0; // the call itself, for the record
};

// Runs the calibration target (libexec/iprobe/iprobe-probe-cost), attaches
// the runtime to it and times it; about a fifth of a second.  Throws
// Error(unavailable) when the target is not built.
ProbeCost measure_probe_cost();

}  // namespace iprobe::launcher
