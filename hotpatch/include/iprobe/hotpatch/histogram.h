// `iprobe report --hist`: a function's log2 latency histogram (what the
// runtime keeps per function per thread, rt_layout.h) and, with attach
// --retval, the signed log2 histogram of its integer return value; as text
// bars and JSON.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "iprobe/hotpatch/trace_reader.h"

namespace iprobe {
class JsonWriter;
}

namespace iprobe::hotpatch {

// Completed calls whose inclusive time lies in [low_ns, high_ns); the last
// bucket is open (high_ns 0).
struct LatencyBucket {
    std::uint64_t low_ns = 0, high_ns = 0, count = 0;
};
// Non-empty buckets' span: from the first to the last bucket holding a call.
std::vector<LatencyBucket> latency_buckets(const FunctionStats& f);

// Returns whose value lies in [low, high] (inclusive both; the outermost are open-ended).
struct ValueBucket {
    std::int64_t low = 0, high = 0;
    std::uint64_t count = 0;
};
std::vector<ValueBucket> retval_buckets(const FunctionStats& f);

// bpftrace-like bars, one line per bucket, after a header line.
std::string histogram_text(const FunctionStats& f);
// "histogram" (when its handler kept times) and "retval_histogram" (with
// --retval) fields inside an object the caller opened.
void write_histogram_fields(JsonWriter& json, const FunctionStats& f);

}  // namespace iprobe::hotpatch
