// Which counter events a recording measures, and who counts each: PAPI
// (presets and native names) where it can, the kernel's perf_event_open
// directly where it cannot (see iprobe/formats/fperf_region.h, fperf_event_backend).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "iprobe/formats/fperf_region.h"

namespace iprobe::fperf {

struct UnavailableEvent {
    std::string name;
    std::string reason;
};

struct MeasuredEvent {
    std::string name;
    fperf_event_source source{};
};

struct EventChoice {
    std::vector<MeasuredEvent> measured;       // in the order asked
    std::vector<UnavailableEvent> unavailable;
};

// "papi" or "perf_event": how reports name a backend.
const char* backend_name(std::uint32_t backend);

// False when the user made PAPI unavailable (FPERF_PAPI=off), as it is on a
// machine whose CPU libpfm4 does not know: every event then goes to the
// kernel backend.  Read once.
bool papi_allowed();

// Cycles, instructions, L1 data-cache misses where there is a PMU; page
// faults and context switches from the kernel's software counters anyway.
const std::vector<std::string>& default_events();

// The kernel event a name stands for: perf's names (page-faults, cs,
// cycles, ...) with or without PAPI's "perf::" prefix and in any case, the
// PAPI presets that have a generic kernel equivalent (PAPI_TOT_CYC, ...),
// and raw codes (r1a2b, perf::r1a2b).
std::optional<fperf_event_source> kernel_event(const std::string& name);

// Tries each event, alone and together with those accepted before it (a PMU
// has few counters), in this process: with PAPI first, then the kernel.
// Never throws for an unknown name: it lands in `unavailable` with the reason.
EventChoice resolve_events(const std::vector<std::string>& requested);

// Every event this machine can count (PAPI presets and natives, the kernel's
// events), each with its backend: for `fperf events`.
std::vector<MeasuredEvent> available_events();

// The chosen events read together on the calling thread, as the handler
// reads them: to estimate the cost of a sample before the handler says.
class EventReader {
public:
    explicit EventReader(const std::vector<MeasuredEvent>& events);
    ~EventReader();
    EventReader(const EventReader&) = delete;
    EventReader& operator=(const EventReader&) = delete;
    void read();

private:
    int papi_set_;
    int kernel_group_ = -1;
    std::vector<int> kernel_fds_;
};

} // namespace iprobe::fperf
