#include "budget_daemon.h"

#include <algorithm>
#include <cmath>

#include "iprobe/support/error.h"

namespace iprobe::fperf {

Costs estimate_costs_in_process(const std::vector<MeasuredEvent>& events) {
    EventReader counters(events);
    timespec ts{};
    const int rounds = 2000;
    const auto t0 = monotonic_ns();
    for (int i = 0; i < rounds; i++)
        for (int side = 0; side < 2; side++) {
            counters.read();
            ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
            ::clock_gettime(CLOCK_MONOTONIC, &ts);
        }
    const auto elapsed = monotonic_ns() - t0;
    return {static_cast<double>(elapsed) / rounds, 5.0, "estimated in the fperf process: the handler has not attached"};
}

Costs costs_from_handler(const fperf_shm_header& h) {
    return {static_cast<double>(h.sample_cost_ns), static_cast<double>(h.count_cost_ns),
            "measured in the target by the handler at attach"};
}

}  // namespace iprobe::fperf
