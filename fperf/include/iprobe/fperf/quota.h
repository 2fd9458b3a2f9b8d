// The budget arithmetic of fperf's control daemon, kept pure (no clock, no
// shared memory) so it is deterministic and unit-tested.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace iprobe::fperf {

inline constexpr std::int64_t kUnlimitedQuota = INT64_MAX;

struct Budget {
    bool unlimited = false;        // "no budget": sample every call
    double fraction = 0.05;        // allowed overhead relative to the target's own work
    // The target's own work in the last interval: CPU time its threads used,
    // less the profiler's estimated share of it.  (For one busy thread this
    // is the interval's wall time.)
    std::uint64_t work_ns = 100'000'000;
    double sample_cost_ns = 1000;  // extra time of one sampled call
    double count_cost_ns = 5;      // extra time of one counted-only call
    // Extra time of one context switch of a target thread while the kernel
    // backend's counters are open on it (the kernel switches them out and
    // in, and counts the switch): paid whatever the quotas.
    double switch_cost_ns = 0;
    // What the next interval pays whatever the quotas (its context switches
    // at switch_cost_ns, as many as in the last one): taken from the samples'
    // share, like counting.
    double fixed_ns = 0;
    // Estimated overhead spent so far beyond budget × work so far (quotas
    // are set from the last interval, so they overshoot when the target
    // speeds up, and new functions' first samples are not budgeted): the
    // next interval pays it back before it samples.
    double debt_ns = 0;
};

// What the daemon saw of one function.
struct FunctionActivity {
    std::uint64_t calls_total = 0;     // since recording started
    std::uint64_t calls_interval = 0;  // during the last interval
    std::uint64_t samples_total = 0;
};

// Samples the next interval may take: budget × work, minus what the calls
// cost anyway on the count-only path, the fixed cost and the debt, divided by
// the cost of one sample.
// Overhead ≤ budget × work is slowdown ≤ 1 + budget.
std::uint64_t sample_allowance(const Budget& budget, std::uint64_t calls_in_interval);

// Quotas for the next interval.  Rules, in order:
//  1. a function never sampled (never seen, or seen but never sampled) gets
//     at least one sample, whatever the allowance;
//  2. the rest of the allowance is shared by the other functions, each
//     asking for as many samples as it had calls last interval (at least 1):
//     small askers get all they ask for, the busiest share what is left
//     equally (water-filling), so rare functions are never starved by hot
//     ones.  Ties go by position, so the result is deterministic.
std::vector<std::int64_t> allocate_quotas(std::span<const FunctionActivity> functions,
                                          std::uint64_t allowance);

// Functions whose probes should be removed because counting their calls
// alone costs too much: while the count-only cost of the last interval is
// above `share` of the budget less the debt (overspending so far, paid back
// by counting less), the busiest function that has at least `min_samples`
// samples goes (its calls are no longer counted after that).
// Deterministic: by calls in the interval, then by position.  A function
// with fewer than kMinCallsToJudgeHot calls in the interval never goes: in a
// stretch where the target hardly ran, a handful of calls would look like
// the whole budget, yet counting them costs next to nothing in absolute terms.
constexpr std::uint64_t kMinCallsToJudgeHot = 1000;
std::vector<std::size_t> probes_to_remove(std::span<const FunctionActivity> functions, const Budget& budget,
                                          double share = 0.5, std::uint64_t min_samples = 1);

// Estimated overhead in ns of `samples` sampled and `calls` counted calls,
// and of `switches` context switches of the target with counters open.
double overhead_ns(const Budget& budget, std::uint64_t samples, std::uint64_t calls, std::uint64_t switches = 0);

} // namespace iprobe::fperf
