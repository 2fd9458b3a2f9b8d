// A finished recording (the fperf.data file) and what `fperf report` derives
// from it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace iprobe::fperf {

struct EventColumn {
    std::string name;
    bool measured = false;
    std::string reason;  // why not, when unavailable
    std::string backend; // who counted it, when measured: "papi" or "perf_event"
};

struct FunctionProfile {
    std::uint64_t address = 0;  // run-time address in the target
    std::string name;           // "0x..." when it could not be symbolized
    std::string module;
    std::uint64_t calls = 0;
    std::uint64_t samples = 0;
    std::uint64_t wall_ns = 0;  // summed over samples
    std::uint64_t cpu_ns = 0;
    std::vector<std::uint64_t> events;  // one per EventColumn, summed over samples
    bool probes_removed = false;  // too hot to count: calls counted only until then
};

struct Profile {
    std::map<std::string, std::string> meta;  // target, budget, costs, overhead, counters
    std::vector<EventColumn> events;          // requested, in order
    std::vector<FunctionProfile> functions;

    std::string get(const std::string& key, const std::string& fallback = "") const;
    double number(const std::string& key, double fallback = 0) const;

    void save(const std::string& path) const;  // atomic
    static Profile load(const std::string& path);
};

// One measured quantity of the report: wall, cpu, or a measured event.
struct Metric {
    std::string name;
    std::string unit;  // "ns" or "" (a count)
    int event = -1;    // index into Profile::events, -1 for wall/cpu
    bool is_cpu = false;
    double floor = 0;  // per-sample cost of the clocks themselves, subtracted from means
};

std::vector<Metric> report_metrics(const Profile& profile);
std::uint64_t metric_total(const FunctionProfile& f, const Metric& m);
// Mean per sampled call, less the metric's floor; NaN when the function has no sample.
double metric_mean(const FunctionProfile& f, const Metric& m);
// Estimated total over all calls: mean × calls (0 without a sample).
double metric_estimated_total(const FunctionProfile& f, const Metric& m);

std::string render_table(const Profile& profile, std::size_t limit);
std::string render_json(const Profile& profile);
std::string render_csv(const Profile& profile);
std::string render_svg(const Profile& profile, std::size_t top);

} // namespace iprobe::fperf
