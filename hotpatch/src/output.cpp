#include "iprobe/hotpatch/output.h"

#include <cinttypes>
#include <cstdio>

namespace iprobe::hotpatch {

std::string trace_text_line(const TraceRecord& r) {
    char head[96];
    std::snprintf(head, sizeof head, "%" PRIu64 ".%09" PRIu64 " %7u ", static_cast<std::uint64_t>(r.time_ns / 1000000000ull),
                  static_cast<std::uint64_t>(r.time_ns % 1000000000ull), r.tid);
    std::string line = head;
    line.append(static_cast<std::size_t>(r.depth) * 2, ' ');
    line += r.kind == probelist::ProbeKind::entry ? "-> " : r.kind == probelist::ProbeKind::exit ? "<- " : "@ ";
    line += r.function;
    if (r.kind == probelist::ProbeKind::point)
        for (std::size_t i = 0; i < r.args.size(); i++)
            line += (i ? ", " : " (") + std::to_string(r.args[i]) + (i + 1 == r.args.size() ? ")" : "");
    if (r.in_signal) line += "  [in signal handler]";
    line += "\n";
    return line;
}

}  // namespace iprobe::hotpatch
