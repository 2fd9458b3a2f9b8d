#include "budget_daemon.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <thread>

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
    return {static_cast<double>(elapsed) / rounds, 5.0, 0, "estimated in the fperf process: the handler has not attached"};
}

Costs costs_from_handler(const fperf_shm_header& h) {
    return {static_cast<double>(h.sample_cost_ns), static_cast<double>(h.count_cost_ns), 0,
            "measured in the target by the handler at attach"};
}

namespace {

// CPU ns of one round trip of a byte between two threads of this process
// (each thread blocks once per round trip: two context switches), with the
// counters of `events` open on both threads when `counted`.
double round_trip_cpu_ns(const std::vector<MeasuredEvent>& events, bool counted, int rounds) {
    int there[2], back[2];
    if (::pipe(there) != 0) return 0;
    if (::pipe(back) != 0) {
        ::close(there[0]), ::close(there[1]);
        return 0;
    }
    std::thread peer([&] {
        std::optional<EventReader> counters;
        if (counted) counters.emplace(events);
        char c;
        for (int i = 0; i < rounds; i++)
            if (::read(there[0], &c, 1) != 1 || ::write(back[1], &c, 1) != 1) break;
    });
    double ns = 0;
    {
        std::optional<EventReader> counters;
        if (counted) counters.emplace(events);
        timespec t0{}, t1{};
        ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t0);
        char c = 0;
        for (int i = 0; i < rounds; i++)
            if (::write(there[1], &c, 1) != 1 || ::read(back[0], &c, 1) != 1) break;
        ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t1);
        ns = (static_cast<double>(t1.tv_sec - t0.tv_sec) * 1e9 + static_cast<double>(t1.tv_nsec - t0.tv_nsec)) / rounds;
    }
    peer.join();
    for (const int fd : {there[0], there[1], back[0], back[1]}) ::close(fd);
    return ns;
}

}  // namespace

double measure_switch_cost_ns(const std::vector<MeasuredEvent>& events) {
    std::vector<MeasuredEvent> kernel;
    for (const auto& e : events)
        if (e.source.backend == FPERF_BACKEND_KERNEL) kernel.push_back(e);
    if (kernel.empty()) return 0;
    // Interleaved, the fastest of each: a preemption only ever adds time.
    const int rounds = 2000, tries = 5;
    double plain = 1e300, counted = 1e300;
    for (int t = 0; t < tries; t++) {
        plain = std::min(plain, round_trip_cpu_ns(kernel, false, rounds));
        counted = std::min(counted, round_trip_cpu_ns(kernel, true, rounds));
    }
    // A load spike over every counted try would make the counters look
    // dearer than the switch itself, which they are not (~15% of it here):
    // the switch's own cost bounds theirs.
    return std::clamp((counted - plain) / 2, 0.0, plain / 2);
}

}  // namespace iprobe::fperf
