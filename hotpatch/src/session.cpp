#include "session.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace iprobe::hotpatch {

std::string basename_of(const std::string& path) {
    const auto slash = path.rfind('/');
    return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string canonical_or_same(const std::string& path) {
    std::error_code ec;
    auto c = std::filesystem::canonical(path, ec);
    return ec ? path : c.string();
}

std::uint64_t elapsed_us(Clock::time_point since) {
    return static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - since).count());
}

Target target_owner(pid_t pid) {
    struct stat st {};
    if (::stat(("/proc/" + std::to_string(pid)).c_str(), &st) != 0)
        throw Error("no such process: " + std::to_string(pid), ExitCode::not_found);
    return {st.st_uid, st.st_gid};
}

pid_t pid_in_own_namespace(pid_t pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/status");
    std::string line;
    while (std::getline(in, line))
        if (line.rfind("NSpid:", 0) == 0) {
            std::istringstream fields(line.substr(6));
            pid_t last = pid, v = 0;
            while (fields >> v) last = v;
            return last;
        }
    return pid;
}

}  // namespace iprobe::hotpatch
