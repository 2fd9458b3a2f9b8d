#include "iprobe/support/lock_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "iprobe/support/error.h"

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

}  // namespace

LockFile::LockFile(const std::string& name, const std::string& busy_message) : path_(lock_dir() + "/" + name) {
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
