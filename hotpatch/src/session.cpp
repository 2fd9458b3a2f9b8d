#include "session.h"

#include <sys/stat.h>

#include "iprobe/support/proc.h"

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
    const auto levels = proc::status_numbers(pid, "NSpid");
    return levels.empty() ? pid : static_cast<pid_t>(levels.back());
}

}  // namespace iprobe::hotpatch
