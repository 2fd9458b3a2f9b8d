// What a debug session reports when a generation of clones ends (a
// re-clone, or the end of the session): the clones' per-function
// aggregates, merged (each clone probes its share of the functions), and
// for each function when its probes were on (`--adapt` turns them off and
// on; a report without that would pass partial counts off as whole).
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "iprobe/hotpatch/trace_reader.h"

namespace iprobe {
class JsonWriter;
}

namespace iprobe::launcher {

// When each function (by raw symbol) had its probes on, in session seconds.
class ProbeTimeline {
public:
    void on(const std::string& symbol, double t_s);
    void off(const std::string& symbol, double t_s);
    // Closed at `end_s` where still on.
    std::vector<std::pair<double, double>> intervals(const std::string& symbol, double end_s) const;
    bool knows(const std::string& symbol) const { return spans_.count(symbol) != 0; }

private:
    std::map<std::string, std::vector<std::pair<double, double>>> spans_;  // open: second < 0
};

struct GenerationReport {
    int generation = 0;
    double start_s = 0, end_s = 0;  // session seconds
    struct Row {
        hotpatch::FunctionStats stats;  // merged over the clones
        int clone = -1;                 // the clone that probed it (-1: several)
        std::vector<std::pair<double, double>> probed;  // session seconds
    };
    std::vector<Row> rows;  // sorted by inclusive time, calls, name
};

// Merges the clones' rows; `timelines[i]` is clone i's.
GenerationReport build_report(int generation, double start_s, double end_s,
                              const std::vector<std::vector<hotpatch::FunctionStats>>& per_clone,
                              const std::vector<const ProbeTimeline*>& timelines);
void write_report(JsonWriter& json, const GenerationReport& report);
std::string report_table(const GenerationReport& report);

}  // namespace iprobe::launcher
