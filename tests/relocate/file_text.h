// What a process's code should hold when nothing changed it: the bytes of
// its mapped file.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace iprobe::test {

// The bytes of every executable mapping of `path_suffix` in `pid`, read
// from the mapped file itself at the mapping's offset: what the code holds
// when nothing was changed.
inline std::vector<std::uint8_t> file_text_of(pid_t pid, const std::string& path_suffix) {
    std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
    std::string line;
    std::vector<std::uint8_t> bytes;
    while (std::getline(maps, line)) {
        std::istringstream f(line);
        std::string range, perms, off, dev, inode, path;
        f >> range >> perms >> off >> dev >> inode >> path;
        if (perms.size() < 3 || perms[2] != 'x' || path.size() < path_suffix.size() ||
            path.compare(path.size() - path_suffix.size(), path_suffix.size(), path_suffix) != 0)
            continue;
        const auto dash = range.find('-');
        const std::uint64_t lo = std::stoull(range.substr(0, dash), nullptr, 16);
        const std::uint64_t hi = std::stoull(range.substr(dash + 1), nullptr, 16);
        std::vector<std::uint8_t> chunk(hi - lo, 0);
        const int fd = ::open(path.c_str(), O_RDONLY);
        const ssize_t got = ::pread(fd, chunk.data(), chunk.size(), static_cast<off_t>(std::stoull(off, nullptr, 16)));
        ::close(fd);
        EXPECT_GT(got, 0) << path;
        bytes.insert(bytes.end(), chunk.begin(), chunk.end());  // past the file's end: zeros, as mapped
    }
    return bytes;
}

}  // namespace iprobe::test
