// The budget controller: what a sample and a counted call cost, and each
// interval's quotas so the overhead stays inside the budget.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "iprobe/formats/fperf_region.h"
#include "iprobe/fperf/events.h"
#include "iprobe/fperf/quota.h"
#include "iprobe/fperf/session.h"

namespace iprobe::fperf {

struct Costs {
    double sample_ns = 0, count_ns = 0;
    double switch_ns = 0;  // a target thread's context switch with the kernel backend's counters open
    std::string source;
};

// Until the handler reports its own measurement: the same reads timed here.
Costs estimate_costs_in_process(const std::vector<MeasuredEvent>& events);

Costs costs_from_handler(const fperf_shm_header& h);

// What one context switch costs more with the kernel backend's counters of
// `events` open on the thread (0 when none of them is counted by the
// kernel): two threads of this process passing a byte back and forth through
// pipes, with and without the counters, the fastest of several tries each.
double measure_switch_cost_ns(const std::vector<MeasuredEvent>& events);

// A function too hot to keep counting: its run-time address and its slot.
struct HotFunction {
    std::uint64_t address = 0;
    std::uint32_t slot = 0;
};

struct DaemonResult {
    std::uint64_t intervals = 0;
    std::uint64_t last_allowance = 0;
    std::uint64_t calls = 0, samples = 0, functions = 0;  // as of the last refill
    std::uint64_t switches = 0;  // the target's context switches while counters were open on its threads
    std::uint64_t work_ns = 0;  // the target's own work, summed over intervals
    double overhead_ns = 0;     // our estimated cost, summed over intervals
    bool cpu_known = true;      // work came from the target's CPU time
};

class Daemon {
public:
    Daemon(SharedSession& session, Budget budget, Costs costs, const std::vector<MeasuredEvent>& events)
        : session_(session), budget_(budget), costs_(std::move(costs)), events_(events) {
        budget_.sample_cost_ns = costs_.sample_ns;
        budget_.count_cost_ns = costs_.count_ns;
        budget_.switch_cost_ns = costs_.switch_ns;
    }

    // One refill: see what ran, work out the next interval's quotas (handed
    // out by publish_quotas()).  `cpu_ns`: CPU time the target used in the
    // interval, when known, and `switches`: the times its threads were
    // switched in.  Returns the run-time addresses of functions too hot to
    // keep counting (only when `removable`, i.e. their probes can be taken
    // out).
    std::vector<HotFunction> refill(std::uint64_t elapsed_ns, std::optional<std::uint64_t> cpu_ns,
                                      std::uint64_t switches, bool removable) {
        session_.heartbeat();
        if (!handler_costs_ && session_.handler_ready() && session_.header().sample_cost_ns) {
            const double switch_ns = costs_.switch_ns;
            costs_ = costs_from_handler(session_.header());
            costs_.switch_ns = switch_ns;
            budget_.sample_cost_ns = costs_.sample_ns;
            budget_.count_cost_ns = costs_.count_ns;
            handler_costs_ = true;
        }
        // Once enough real samples were timed in the target, budget with them.
        const auto& hdr = session_.header();
        const std::uint64_t timed = hdr.sampling_count.load(std::memory_order_relaxed);
        if (timed >= 100) {
            budget_.sample_cost_ns = static_cast<double>(hdr.sampling_ns.load(std::memory_order_relaxed)) /
                                     static_cast<double>(timed);
            if (!live_costs_) costs_.source += "; then timed live on real samples";
            live_costs_ = true;
            costs_.sample_ns = budget_.sample_cost_ns;
        }
        // Counted calls likewise: the calibrated count cost is cache-warm, a
        // real site pays the misses too (fperf_region.h, count_warm_ns).
        const std::uint64_t counted = hdr.counting_count.load(std::memory_order_relaxed);
        if (handler_costs_ && counted >= 100) {
            const double live = static_cast<double>(hdr.counting_ns.load(std::memory_order_relaxed)) /
                                static_cast<double>(counted);
            const double misses = std::max(0.0, live - static_cast<double>(hdr.count_warm_ns));
            budget_.count_cost_ns = static_cast<double>(hdr.count_cost_ns) + misses;
            if (!live_count_costs_) costs_.source += "; counted calls timed live";
            live_count_costs_ = true;
            costs_.count_ns = budget_.count_cost_ns;
        }
        const auto snap = session_.snapshot();
        std::uint64_t calls_interval = 0, samples_interval = 0;
        const auto activity = activity_since(snap, previous_calls_, calls_interval);
        const std::uint64_t samples_before = result_.samples;
        result_.calls = result_.samples = 0;
        result_.functions = snap.size();
        for (const auto& s : snap) {
            result_.calls += s.calls;
            result_.samples += s.samples;
        }
        samples_interval = result_.samples >= samples_before ? result_.samples - samples_before : 0;
        // The counters a thread's first sample opened cost it at every
        // context switch from then on, sampled or not.
        const bool counters_open = budget_.switch_cost_ns > 0 && session_.header().threads.load() > 0;
        const std::uint64_t switches_paid = counters_open ? switches : 0;
        result_.switches += switches_paid;
        // The target's own work: its CPU time less what we cost it.  A
        // target that waits does little work, and gets few samples.
        const double spent = overhead_ns(budget_, samples_interval, calls_interval, switches_paid);
        const std::uint64_t work = own_work(elapsed_ns, cpu_ns, spent);
        result_.work_ns += work;
        // Everything so far at today's costs, not each interval's at the
        // costs known then: the calibration's cost of a sample can be far
        // from the live one (hundreds of us against ~1 us on a VM without a
        // PMU), and a debt made of it would never be paid back.
        result_.overhead_ns = overhead_ns(budget_, result_.samples, result_.calls, result_.switches);
        result_.cpu_known = result_.cpu_known && cpu_ns.has_value();
        budget_.debt_ns = result_.overhead_ns - budget_.fraction * static_cast<double>(result_.work_ns);
        Budget b = budget_;
        b.work_ns = work;
        b.fixed_ns = static_cast<double>(switches_paid) * budget_.switch_cost_ns;
        result_.last_allowance = sample_allowance(b, calls_interval);
        const auto quotas = allocate_quotas(activity, result_.last_allowance);
        pending_quotas_.clear();
        for (std::size_t i = 0; i < snap.size(); i++) pending_quotas_.emplace_back(snap[i].slot, quotas[i]);
        result_.intervals++;
        std::vector<HotFunction> hot;
        if (removable)
            for (const auto i : probes_to_remove(activity, b)) hot.push_back({snap[i].address, snap[i].slot});
        return hot;
    }

    // Between refills, every poll: functions that turned hot since the last
    // look (the target entered a new phase) are shed now rather than counted
    // at full cost until the next refill.
    std::vector<HotFunction> newly_hot(std::uint64_t elapsed_ns, std::optional<std::uint64_t> cpu_ns) {
        const auto snap = session_.snapshot();
        std::uint64_t calls = 0;
        const auto activity = activity_since(snap, polled_calls_, calls);
        Budget b = budget_;
        b.work_ns = own_work(elapsed_ns, cpu_ns, overhead_ns(budget_, 0, calls));
        std::vector<HotFunction> hot;
        for (const auto i : probes_to_remove(activity, b)) hot.push_back({snap[i].address, snap[i].slot});
        return hot;
    }

    // After the hot functions' probes are gone: removing them stops the
    // target, and a sample opened on a fresh quota just before would lose
    // its exit (a function never sampled would then stay unsampled).
    void publish_quotas() {
        for (const auto& [slot, quota] : pending_quotas_) session_.set_quota(slot, quota);
        pending_quotas_.clear();
    }

    const Costs& costs() const { return costs_; }
    const Budget& budget() const { return budget_; }
    const DaemonResult& result() const { return result_; }

private:
    // The target's own work over a stretch: its CPU time (wall time when
    // unknown) less what we are estimated to have cost it.
    static std::uint64_t own_work(std::uint64_t elapsed_ns, std::optional<std::uint64_t> cpu_ns, double spent_ns) {
        const double used = cpu_ns ? static_cast<double>(*cpu_ns) : static_cast<double>(elapsed_ns);
        return used > spent_ns ? static_cast<std::uint64_t>(used - spent_ns) : 0;
    }

    // What each function did since `previous` was last updated (calls per
    // slot); `calls` gets their sum.
    static std::vector<FunctionActivity> activity_since(const std::vector<SlotSnapshot>& snap,
                                                        std::map<std::uint32_t, std::uint64_t>& previous,
                                                        std::uint64_t& calls) {
        std::vector<FunctionActivity> activity;
        activity.reserve(snap.size());
        for (const auto& s : snap) {
            auto& prev = previous[s.slot];
            const std::uint64_t delta = s.calls >= prev ? s.calls - prev : s.calls;
            prev = s.calls;
            activity.push_back({s.calls, delta, s.samples});
            calls += delta;
        }
        return activity;
    }

    SharedSession& session_;
    Budget budget_;
    Costs costs_;
    std::vector<MeasuredEvent> events_;
    bool handler_costs_ = false;
    bool live_costs_ = false;
    bool live_count_costs_ = false;
    std::map<std::uint32_t, std::uint64_t> previous_calls_, polled_calls_;
    std::vector<std::pair<std::uint32_t, std::int64_t>> pending_quotas_;
    DaemonResult result_;
};

}  // namespace iprobe::fperf
