// Internal: CRIU's statistics image and invocation details.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace iprobe::launcher {

// CRIU's stats-dump image (protobuf DumpStatsEntry inside StatsEntry).
struct DumpStats {
    std::uint64_t freezing_us = 0;  // stopping the tasks
    std::uint64_t frozen_us = 0;    // tasks stopped until resumed
    std::uint64_t memdump_us = 0;
    std::uint64_t memwrite_us = 0;
    std::uint64_t pages_scanned = 0;
    std::uint64_t pages_written = 0;
};

// Parses IMAGES/stats-dump; throws Error(failure) when absent or malformed.
DumpStats read_dump_stats(const std::string& images_dir);

// Throws Error(permission) naming `what` unless running as root.
void require_root(const char* what);

// Throws Error(usage) unless `name` is a usable clone name (letters, digits,
// '-', '_', '.', at most 64, not starting with '.').
void validate_name(const std::string& name);

// Keeps a CRIU log from a directory about to be removed as
// /tmp/iprobe-clone-NAME-STEP.log; returns "\n  full log: PATH" for an
// error message, or "" when it could not be copied.
std::string keep_criu_log(const std::string& log_path, const std::string& name, const char* step);

// The lines of a CRIU log that say why it failed ("Error (...)"), most
// useful last, at most `max_lines`.
std::string criu_log_errors(const std::string& log_path, std::size_t max_lines = 6);

}  // namespace iprobe::launcher
