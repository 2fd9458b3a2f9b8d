// Which counter events a recording measures: PAPI presets and native names,
// checked against what this machine can actually count.
#pragma once

#include <string>
#include <vector>

namespace fperf {

struct UnavailableEvent {
    std::string name;
    std::string reason;
};

struct EventChoice {
    std::vector<std::string> measured;         // in the order asked
    std::vector<UnavailableEvent> unavailable;
};

// Cycles, instructions, L1 data-cache misses where there is a PMU; page
// faults and context switches from the kernel's software counters anyway.
const std::vector<std::string>& default_events();

// Tries each event, alone and together with those accepted before it (a PMU
// has few counters), in this process.  Never throws for an unknown name:
// it lands in `unavailable` with PAPI's reason.
EventChoice resolve_events(const std::vector<std::string>& requested);

// Every event PAPI can count here (presets and perf_event natives), for --list-events.
std::vector<std::string> available_events();

}  // namespace fperf
