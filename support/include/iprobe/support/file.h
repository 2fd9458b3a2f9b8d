#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace iprobe {

// The whole of a regular file.  Anything else (a directory, a FIFO, a device)
// is Error(bad_input), found without blocking.
std::vector<std::uint8_t> read_file(const std::string& path);

// Replaces `path` with `data` so that readers see either the old or the new
// file, never a mix: write a sibling temp file, fsync, rename.  Mode and
// ownership follow `mode_from` (an existing file) when given.
void write_file_atomic(const std::string& path, const void* data, std::size_t size,
                       const std::string& mode_from = {});

}  // namespace iprobe
