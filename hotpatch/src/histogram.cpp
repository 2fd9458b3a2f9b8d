#include "iprobe/hotpatch/histogram.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>

#include "iprobe/support/json.h"

namespace iprobe::hotpatch {

namespace {

std::uint64_t ticks_to_ns(std::uint64_t ticks, double ns_per_tick) {
    const double ns = static_cast<double>(ticks) * ns_per_tick;
    return ns >= 9.2e18 ? UINT64_MAX : static_cast<std::uint64_t>(ns);
}

std::string human_ns(std::uint64_t ns) {
    char buf[32];
    if (ns < 1000) std::snprintf(buf, sizeof buf, "%" PRIu64 "ns", ns);
    else if (ns < 1000000) std::snprintf(buf, sizeof buf, "%.3gus", static_cast<double>(ns) / 1e3);
    else if (ns < 1000000000) std::snprintf(buf, sizeof buf, "%.3gms", static_cast<double>(ns) / 1e6);
    else std::snprintf(buf, sizeof buf, "%.3gs", static_cast<double>(ns) / 1e9);
    return buf;
}

std::string bar(std::uint64_t count, std::uint64_t most) {
    constexpr int kWidth = 40;
    const int n = most ? static_cast<int>((count * kWidth + most - 1) / most) : 0;
    return "|" + std::string(static_cast<std::size_t>(n), '@') + std::string(static_cast<std::size_t>(kWidth - n), ' ') + "|";
}

template <typename Bucket>
std::uint64_t most_of(const std::vector<Bucket>& buckets) {
    std::uint64_t most = 0;
    for (const auto& b : buckets) most = std::max(most, b.count);
    return most;
}

// The first and last bucket holding a count; {-1, -1} when none does.
std::pair<int, int> span(const std::uint64_t* counts, int n) {
    int first = -1, last = -1;
    for (int b = 0; b < n; b++)
        if (counts[b]) {
            if (first < 0) first = b;
            last = b;
        }
    return {first, last};
}

}  // namespace

std::vector<LatencyBucket> latency_buckets(const FunctionStats& f) {
    const auto [first, last] = span(f.raw.histogram, IPROBE_RT_HIST_BUCKETS);
    std::vector<LatencyBucket> out;
    for (int b = first; first >= 0 && b <= last; b++) {
        const std::uint64_t low = b == 0 ? 0 : 1ull << b;
        const std::uint64_t high = b == IPROBE_RT_HIST_BUCKETS - 1 ? 0 : ticks_to_ns(2ull << b, f.ns_per_tick);
        out.push_back({ticks_to_ns(low, f.ns_per_tick), high, f.raw.histogram[b]});
    }
    return out;
}

std::vector<ValueBucket> retval_buckets(const FunctionStats& f) {
    const auto [first, last] = span(f.raw.retval_histogram, IPROBE_RT_RETVAL_BUCKETS);
    std::vector<ValueBucket> out;
    constexpr int zero = IPROBE_RT_RETVAL_ZERO_BUCKET;
    for (int b = first; first >= 0 && b <= last; b++) {
        ValueBucket v;
        v.count = f.raw.retval_histogram[b];
        if (b == zero) {
            v.low = v.high = 0;
        } else if (b > zero) {  // bit length k = b - zero: [2^(k-1), 2^k - 1], the last open
            const int k = b - zero;
            v.low = std::int64_t{1} << (k - 1);
            v.high = b == IPROBE_RT_RETVAL_BUCKETS - 1 ? INT64_MAX : (std::int64_t{1} << k) - 1;
        } else {  // -v of bit length k = zero - b
            const int k = zero - b;
            v.high = -(std::int64_t{1} << (k - 1));
            v.low = b == 0 ? INT64_MIN : -((std::int64_t{1} << k) - 1);
        }
        out.push_back(v);
    }
    return out;
}

std::string histogram_text(const FunctionStats& f) {
    std::string out;
    char line[256];
    if (!f.has_times()) {  // the count handler: no latency kept, none shown
        out = f.function + ": no latency histogram (its handler kept no times: --handler trace keeps them)\n";
    } else {
        out = f.function + ": latency of " + std::to_string(f.raw.timed) + " timed calls (" +
              std::to_string(f.completed) + " completed)\n";
        const auto lat = latency_buckets(f);
        const std::uint64_t most = most_of(lat);
        for (const auto& b : lat) {
            const std::string range = "[" + human_ns(b.low_ns) + ", " + (b.high_ns ? human_ns(b.high_ns) : "...") + ")";
            std::snprintf(line, sizeof line, "  %-20s %12" PRIu64 " %s\n", range.c_str(), b.count,
                          bar(b.count, most).c_str());
            out += line;
        }
    }
    if (!f.retval_histogram) return out;
    const auto values = retval_buckets(f);
    std::uint64_t total = 0;
    for (const auto& v : values) total += v.count;
    out += f.function + ": return value of " + std::to_string(total) + " calls";
    if (f.completed > total)  // said, not left to a reader to subtract
        out += " (" + std::to_string(f.completed - total) +
               " more completed calls had none: an inlined copy does not return, an unwound call returns nothing)";
    out += "\n";
    const std::uint64_t vmost = most_of(values);
    for (const auto& v : values) {
        std::string range;
        if (v.low == v.high) range = "[" + std::to_string(v.low) + "]";
        else
            range = "[" + (v.low == INT64_MIN ? std::string("...") : std::to_string(v.low)) + ", " +
                    (v.high == INT64_MAX ? std::string("...") : std::to_string(v.high)) + "]";
        std::snprintf(line, sizeof line, "  %-28s %12" PRIu64 " %s\n", range.c_str(), v.count, bar(v.count, vmost).c_str());
        out += line;
    }
    return out;
}

void write_histogram_fields(JsonWriter& j, const FunctionStats& f) {
    if (f.has_times()) {  // absent, never empty, where the handler kept no times
        j.key("histogram").begin_array();
        for (const auto& b : latency_buckets(f))
            j.begin_object().field("low_ns", b.low_ns).field("high_ns", b.high_ns).field("count", b.count).end_object();
        j.end_array();
    }
    if (!f.retval_histogram) return;
    j.key("retval_histogram").begin_array();
    for (const auto& v : retval_buckets(f))
        j.begin_object().field("low", v.low).field("high", v.high).field("count", v.count).end_object();
    j.end_array();
}

}  // namespace iprobe::hotpatch
