#include "iprobe/support/lock_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "iprobe/support/error.h"
#include "iprobe/support/number.h"

namespace iprobe {

namespace {

// A directory only we can write to: an existing one made by someone else
// (or a symlink planted in /tmp) could hand our locks to them.
bool ours(const std::string& dir) {
    struct stat st {};
    return ::lstat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == ::geteuid() &&
           (st.st_mode & 022) == 0;
}

std::string lock_dir() {
    const std::string run = "/run/iprobe";
    if ((::mkdir(run.c_str(), 0700) == 0 || errno == EEXIST) && ours(run)) return run;
    const std::string tmp = "/tmp/iprobe-" + std::to_string(::geteuid());
    if (::mkdir(tmp.c_str(), 0700) != 0 && errno != EEXIST) throw_errno("cannot create " + tmp);
    if (!ours(tmp))
        throw Error(tmp + " is not a directory of this user's with mode 0700; remove it and retry",
                    ExitCode::permission);
    return tmp;
}

bool names_same_file(const std::string& path, int fd) {
    struct stat opened {}, named {};
    return ::fstat(fd, &opened) == 0 && ::stat(path.c_str(), &named) == 0 && opened.st_dev == named.st_dev &&
           opened.st_ino == named.st_ino;
}

// Locks of processes that no longer exist, left by a holder that was killed
// (SIGKILL runs no destructor): flock died with the holder, so the file is
// only clutter; removed under the lock, the same way a holder removes it.
void remove_stale_locks(const std::string& dir) {
    DIR* d = ::opendir(dir.c_str());
    if (!d) return;
    while (const dirent* entry = ::readdir(d)) {
        const std::string name = entry->d_name;
        const auto dot = name.find('.');
        if (dot == 0 || dot == std::string::npos) continue;
        const auto pid = parse_unsigned(std::string_view(name).substr(0, dot), 1, INT32_MAX);
        if (!pid || ::kill(static_cast<pid_t>(*pid), 0) == 0 || errno != ESRCH) continue;
        const std::string path = dir + "/" + name;
        UniqueFd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
        if (fd && ::flock(fd.get(), LOCK_EX | LOCK_NB) == 0 && names_same_file(path, fd.get())) ::unlink(path.c_str());
    }
    ::closedir(d);
}

}  // namespace

LockFile::LockFile(const std::string& name, const std::string& busy_message) {
    const std::string dir = lock_dir();
    remove_stale_locks(dir);
    path_ = dir + "/" + name;
    for (int attempt = 0;; attempt++) {
        fd_.reset(::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
        if (!fd_) throw_errno("cannot open lock file " + path_);
        if (::flock(fd_.get(), LOCK_EX | LOCK_NB) != 0) {
            if (errno == EWOULDBLOCK) throw Error(busy_message, ExitCode::busy);
            throw_errno("cannot lock " + path_);
        }
        if (names_same_file(path_, fd_.get())) return;
        if (attempt > 100) throw Error("lock file " + path_ + " keeps being replaced; retry");
    }
}

LockFile::~LockFile() {
    // Unlinked while still locked: whoever opens the path next gets a new
    // file, and whoever opened this one meanwhile sees it is gone.
    ::unlink(path_.c_str());
}

}  // namespace iprobe
