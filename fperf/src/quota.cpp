#include "iprobe/fperf/quota.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace iprobe::fperf {

std::uint64_t sample_allowance(const Budget& budget, std::uint64_t calls_in_interval) {
    if (budget.unlimited) return UINT64_MAX;
    const double allowed_ns = budget.fraction * static_cast<double>(budget.work_ns);
    const double counting_ns = static_cast<double>(calls_in_interval) * budget.count_cost_ns;
    const double left_ns = allowed_ns - counting_ns - std::max(0.0, budget.fixed_ns) - std::max(0.0, budget.debt_ns);
    if (left_ns <= 0 || budget.sample_cost_ns <= 0) return 0;
    return static_cast<std::uint64_t>(std::floor(left_ns / budget.sample_cost_ns));
}

std::vector<std::int64_t> allocate_quotas(std::span<const FunctionActivity> functions,
                                          std::uint64_t allowance) {
    std::vector<std::int64_t> quotas(functions.size(), 0);
    if (allowance == UINT64_MAX) {
        std::fill(quotas.begin(), quotas.end(), kUnlimitedQuota);
        return quotas;
    }
    std::vector<std::size_t> sharing;
    std::uint64_t left = allowance;
    for (std::size_t i = 0; i < functions.size(); i++) {
        const auto& f = functions[i];
        if (f.samples_total == 0) {
            quotas[i] = 1;
            // Seen but unsampled functions will likely come again: their one
            // sample is paid from the allowance.  Never-seen ones mostly never
            // run, so reserving for them would starve the rest.
            if (f.calls_total > 0 && left > 0) left--;
        } else {
            sharing.push_back(i);
        }
    }
    auto demand = [&](std::size_t i) { return std::max<std::uint64_t>(functions[i].calls_interval, 1); };
    std::stable_sort(sharing.begin(), sharing.end(),
                     [&](std::size_t a, std::size_t b) { return demand(a) < demand(b); });
    for (std::size_t k = 0; k < sharing.size(); k++) {
        const std::uint64_t remaining = sharing.size() - k;
        const std::uint64_t share = left / remaining;
        const std::uint64_t want = demand(sharing[k]);
        if (want <= share) {
            quotas[sharing[k]] = static_cast<std::int64_t>(want);
            left -= want;
            continue;
        }
        // Everyone from here on asks for more than an equal share: split
        // what is left equally, the remainder one each in order.
        std::uint64_t extra = left - share * remaining;
        for (std::size_t j = k; j < sharing.size(); j++) {
            std::uint64_t q = share + (extra > 0 ? 1 : 0);
            if (extra > 0) extra--;
            quotas[sharing[j]] = static_cast<std::int64_t>(std::min(q, demand(sharing[j])));
        }
        break;
    }
    return quotas;
}

std::vector<std::size_t> probes_to_remove(std::span<const FunctionActivity> functions, const Budget& budget,
                                          double share, std::uint64_t min_samples) {
    std::vector<std::size_t> out;
    if (budget.unlimited) return out;
    double counting = 0;
    std::vector<std::size_t> order;
    for (std::size_t i = 0; i < functions.size(); i++) {
        counting += static_cast<double>(functions[i].calls_interval) * budget.count_cost_ns;
        if (functions[i].calls_interval >= kMinCallsToJudgeHot && functions[i].samples_total >= min_samples)
            order.push_back(i);
    }
    // Overspending so far (a phase's calls counted before its hot functions
    // could be shed) is paid back by counting less too, not only by sampling
    // less: counting is most of what a busy target pays.
    const double allowed = share * budget.fraction * static_cast<double>(budget.work_ns) - std::max(0.0, budget.debt_ns);
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
        return functions[a].calls_interval > functions[b].calls_interval;
    });
    for (const std::size_t i : order) {
        if (counting <= allowed) break;
        out.push_back(i);
        counting -= static_cast<double>(functions[i].calls_interval) * budget.count_cost_ns;
    }
    return out;
}

double overhead_ns(const Budget& budget, std::uint64_t samples, std::uint64_t calls, std::uint64_t switches) {
    return static_cast<double>(samples) * budget.sample_cost_ns + static_cast<double>(calls) * budget.count_cost_ns +
           static_cast<double>(switches) * budget.switch_cost_ns;
}

} // namespace iprobe::fperf
