#include "session_report.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>

#include "iprobe/support/json.h"

namespace iprobe::launcher {

void ProbeTimeline::on(const std::string& symbol, double t_s) {
    auto& spans = spans_[symbol];
    if (spans.empty() || spans.back().second >= 0) spans.emplace_back(t_s, -1.0);
}

void ProbeTimeline::off(const std::string& symbol, double t_s) {
    auto it = spans_.find(symbol);
    if (it != spans_.end() && !it->second.empty() && it->second.back().second < 0) it->second.back().second = t_s;
}

std::vector<std::pair<double, double>> ProbeTimeline::intervals(const std::string& symbol, double end_s) const {
    auto it = spans_.find(symbol);
    if (it == spans_.end()) return {};
    auto out = it->second;
    for (auto& [from, to] : out)
        if (to < 0) to = end_s;
    return out;
}

GenerationReport build_report(int generation, double start_s, double end_s,
                              const std::vector<std::vector<hotpatch::FunctionStats>>& per_clone,
                              const std::vector<const ProbeTimeline*>& timelines) {
    GenerationReport report;
    report.generation = generation;
    report.start_s = start_s;
    report.end_s = end_s;
    for (const auto& f : hotpatch::merge_functions(per_clone)) {
        GenerationReport::Row row;
        row.stats = f;
        for (std::size_t c = 0; c < per_clone.size(); ++c)
            for (const auto& own : per_clone[c])
                if (own.function == f.function && own.kind == f.kind) row.clone = row.clone < 0 ? static_cast<int>(c) : -2;
        if (row.clone == -2) row.clone = -1;
        // Without a timeline (probes never turned off and on) they were on throughout.
        const ProbeTimeline* timeline = row.clone >= 0 && static_cast<std::size_t>(row.clone) < timelines.size()
                                            ? timelines[static_cast<std::size_t>(row.clone)]
                                            : nullptr;
        if (timeline && timeline->knows(f.symbol)) row.probed = timeline->intervals(f.symbol, end_s);
        else row.probed = {{start_s, end_s}};
        report.rows.push_back(std::move(row));
    }
    std::sort(report.rows.begin(), report.rows.end(), [](const auto& a, const auto& b) {
        return a.stats.inclusive_ns != b.stats.inclusive_ns ? a.stats.inclusive_ns > b.stats.inclusive_ns
               : a.stats.calls != b.stats.calls             ? a.stats.calls > b.stats.calls
                                                            : a.stats.function < b.stats.function;
    });
    return report;
}

namespace {

double probed_s(const GenerationReport::Row& row) {
    double total = 0;
    for (const auto& [from, to] : row.probed) total += std::max(0.0, to - from);
    return total;
}

// The share of the generation's window the function was probed (its counts
// cover that share of the traffic).
double probed_share(const GenerationReport::Row& row, const GenerationReport& r) {
    const double window = r.end_s - r.start_s;
    return window > 0 ? std::min(1.0, probed_s(row) / window) : 1.0;
}

}  // namespace

void write_report(JsonWriter& j, const GenerationReport& r) {
    j.field("generation", r.generation).field("start_s", r.start_s).field("end_s", r.end_s);
    j.key("functions").begin_array();
    for (const auto& row : r.rows) {
        j.begin_object();
        hotpatch::write_function_stats_fields(j, row.stats);
        j.field("clone", row.clone).field("probed_s", probed_s(row)).field("probed_share", probed_share(row, r));
        j.key("probed").begin_array();
        for (const auto& [from, to] : row.probed) j.begin_array().value(from).value(to).end_array();
        j.end_array();
        j.end_object();
    }
    j.end_array();
}

std::string report_table(const GenerationReport& r) {
    std::string out;
    char line[256];
    std::snprintf(line, sizeof line, "%-36s %12s %12s %14s %6s %8s %s\n", "function", "calls", "completed",
                  "incl total ns", "clone", "probed", "when (session s)");
    out += line;
    for (const auto& row : r.rows) {
        std::string spans;
        for (const auto& [from, to] : row.probed) {
            char span[48];
            std::snprintf(span, sizeof span, "%s%.1f-%.1f", spans.empty() ? "" : ",", from, to);
            spans += span;
        }
        std::snprintf(line, sizeof line, "%-36s %12" PRIu64 " %12" PRIu64 " %14" PRIu64 " %6s %7.1f%% %s\n",
                      row.stats.function.c_str(), row.stats.calls, row.stats.completed, row.stats.inclusive_ns,
                      row.clone >= 0 ? std::to_string(row.clone + 1).c_str() : "*", 100.0 * probed_share(row, r),
                      spans.c_str());
        out += line;
    }
    return out;
}

}  // namespace iprobe::launcher
