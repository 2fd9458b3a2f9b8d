#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "iprobe/support/fd.h"

namespace iprobe {

// Opens `path` for reading and checks, before anything is read, that it is
// a regular file: without blocking (a FIFO's open would wait for a writer),
// Error(bad_input) naming what it is instead (a directory, a FIFO, a device
// or socket), Error(not_found) / Error(permission) when it cannot be opened.
// `size` receives its size.
UniqueFd open_regular_file(const std::string& path, std::uint64_t* size = nullptr);

// The largest file read whole (probe lists, binaries): 2 GiB.
inline constexpr std::uint64_t kMaxFileBytes = 2ull << 30;

// The whole of a regular file (open_regular_file()), refused (bad_input)
// above `max_bytes`.
std::vector<std::uint8_t> read_file(const std::string& path, std::uint64_t max_bytes = kMaxFileBytes);

// Replaces `path` with `data` so that readers see either the old or the new
// file, never a mix: write a sibling temp file, fsync, rename.  Mode and
// ownership follow `mode_from` (an existing file) when given.  A symbolic
// link stays: the file it names is replaced.  A path that is not a regular
// file (/dev/null, /dev/stdout, a FIFO) is written into, never replaced.
void write_file_atomic(const std::string& path, const void* data, std::size_t size,
                       const std::string& mode_from = {});

}  // namespace iprobe
