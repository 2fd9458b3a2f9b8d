// Which files the clone gets its own copy of (working directories, files
// written, locked or written through shared mappings), so it never writes
// production's.
#include "clone_steps.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "iprobe/support/error.h"
#include "iprobe/support/proc.h"

namespace fs = std::filesystem;

namespace iprobe::launcher::clone_steps {

namespace {

// Snapshotting a working directory by default is skipped above this size;
// --fs-snapshot still copies it.
constexpr std::uintmax_t kDefaultDirSnapshotLimit = 256ull << 20;


// POSIX shared memory (/dev/shm) is a file the service writes like any
// other; the rest of /dev, /proc and /sys are not files to copy.
bool system_path(const std::string& path) {
    if (under(path, "/dev/shm")) return false;
    for (const char* p : {"/proc", "/sys", "/dev", "/run/netns"})
        if (under(path, p)) return true;
    return false;
}

bool copyable_file(const std::string& path) {
    if (path.empty() || path[0] != '/' || system_path(path) || path.find(" (deleted)") != std::string::npos)
        return false;
    struct stat st;
    return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// Files mapped shared and writable (e.g. an iprobe runtime region, or the
// service's own shared memory): writes through them would reach production.
void shared_writable_mappings(pid_t pid, std::vector<std::string>& files) {
    try {
        for (const auto& m : proc::read_maps(pid))
            if (m.shared_writable() && copyable_file(m.path)) files.push_back(m.path);
    } catch (const Error&) {
    }
}

// A file open for writing, or one the service holds a lock on (a pid file,
// say, even one opened read-only for flock): the clone's restored lock would
// otherwise contend with production's own and CRIU's restore fail.
bool written_or_locked(const std::string& fdinfo_path) {
    std::ifstream info(fdinfo_path);
    std::string line;
    bool written = false, locked = false;
    while (std::getline(info, line)) {
        if (line.starts_with("flags:")) {
            const auto digits = line.find_first_not_of(" \t", 6);
            unsigned flags = 0;
            if (digits != std::string::npos)
                std::from_chars(line.data() + digits, line.data() + line.size(), flags, 8);
            written = (flags & O_ACCMODE) != O_RDONLY;
        } else if (line.starts_with("lock:")) {
            locked = true;
        }
    }
    return written || locked;
}

std::uintmax_t tree_size(const std::string& dir, std::uintmax_t stop_after) {
    std::uintmax_t total = 0;
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(dir, fs::directory_options::skip_permission_denied, ec);
         it != fs::recursive_directory_iterator(); it.increment(ec)) {
        if (ec) break;
        std::error_code e2;
        if (it->is_regular_file(e2)) total += it->file_size(e2);
        if (total > stop_after) break;
    }
    return total;
}

}  // namespace

bool under(const std::string& path, const std::string& dir) {
    if (dir == "/") return true;
    return path == dir || (path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 && path[dir.size()] == '/');
}

std::vector<std::string> snapshot_paths(const CloneOptions& o, const std::vector<pid_t>& tree) {
    std::vector<std::string> dirs, files;
    for (const auto& p : o.fs_snapshot) {
        std::error_code ec;
        fs::path abs = fs::weakly_canonical(fs::absolute(p), ec);
        if (ec || !fs::exists(abs))
            throw Error("--fs-snapshot: no such file or directory: " + p, ExitCode::not_found);
        (fs::is_directory(abs) ? dirs : files).push_back(abs.string());
    }
    if (o.default_snapshots) {
        for (pid_t pid : tree) {
            std::string proc = "/proc/" + std::to_string(pid);
            std::string cwd = readlink_str(proc + "/cwd");
            if (!cwd.empty() && cwd != "/" && cwd[0] == '/' && !system_path(cwd) &&
                cwd.find(" (deleted)") == std::string::npos) {
                if (tree_size(cwd, kDefaultDirSnapshotLimit) <= kDefaultDirSnapshotLimit)
                    dirs.push_back(cwd);
                else
                    progress(o, "not copying working directory " + cwd + " (over 256 MiB); the clone shares it "
                                "unless you pass --fs-snapshot " + cwd);
            }
            std::error_code ec;
            for (const auto& fd : fs::directory_iterator(proc + "/fd", ec)) {
                std::string target = readlink_str(fd.path().string());
                if (!copyable_file(target)) continue;
                if (written_or_locked(proc + "/fdinfo/" + fd.path().filename().string())) files.push_back(target);
            }
            shared_writable_mappings(pid, files);
        }
    }
    std::sort(dirs.begin(), dirs.end());
    dirs.erase(std::unique(dirs.begin(), dirs.end()), dirs.end());
    // A directory inside another snapshotted one is covered by it.
    std::vector<std::string> out;
    for (const auto& d : dirs) {
        if (std::none_of(out.begin(), out.end(), [&](const std::string& o2) { return under(d, o2); }))
            out.push_back(d);
    }
    std::sort(files.begin(), files.end());
    files.erase(std::unique(files.begin(), files.end()), files.end());
    for (const auto& f : files) {
        if (std::none_of(out.begin(), out.end(), [&](const std::string& d) { return under(f, d); }))
            out.push_back(f);
    }
    return out;
}

}  // namespace iprobe::launcher::clone_steps
