#include "iprobe/support/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <functional>
#include <memory>

#include "iprobe/support/error.h"
#include "iprobe/support/fd.h"

namespace iprobe {

UniqueFd open_regular_file(const std::string& path, std::uint64_t* size) {
    // O_NONBLOCK: opening a FIFO must not wait for a writer; only regular
    // files are read.
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
    if (!fd)
        throw_errno("cannot open " + path, errno == EACCES || errno == EPERM ? ExitCode::permission
                                           : errno == ENOENT || errno == ENOTDIR ? ExitCode::not_found
                                                                                 : ExitCode::bad_input);
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) throw_errno("cannot stat " + path);
    if (!S_ISREG(st.st_mode))
        throw Error(path + ": not a regular file (" +
                        (S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a FIFO" : "a device or socket") + ")",
                    ExitCode::bad_input);
    if (size) *size = static_cast<std::uint64_t>(st.st_size);
    return fd;
}

std::vector<std::uint8_t> read_file(const std::string& path, std::uint64_t max_bytes) {
    std::uint64_t size = 0;
    UniqueFd fd = open_regular_file(path, &size);
    if (size > max_bytes)
        throw Error(path + ": " + std::to_string(size) + " bytes, more than iprobe reads of such a file (" +
                        std::to_string(max_bytes >> 20) + " MiB)",
                    ExitCode::bad_input);
    std::vector<std::uint8_t> data(static_cast<std::size_t>(size));
    std::size_t done = 0;
    while (done < data.size()) {
        const ssize_t n = ::read(fd.get(), data.data() + done, data.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) throw_errno("cannot read " + path);
        if (n == 0) break;
        done += static_cast<std::size_t>(n);
    }
    data.resize(done);
    return data;
}

namespace {

void write_all(int fd, const void* data, std::size_t size, const std::function<void(const std::string&)>& fail,
               const std::string& what) {
    const auto* p = static_cast<const std::uint8_t*>(data);
    std::size_t done = 0;
    while (done < size) {
        const ssize_t n = ::write(fd, p + done, size - done);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) fail("cannot write " + what);
        done += static_cast<std::size_t>(n);
    }
}

// `path` when it is no symbolic link, else the file it finally names (a
// link is kept, what it points to replaced), or `path` for a dangling one.
std::string resolved(const std::string& path) {
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return path;
    std::unique_ptr<char, decltype(&std::free)> real(::realpath(path.c_str(), nullptr), &std::free);
    return real ? std::string(real.get()) : path;
}

}  // namespace

void write_file_atomic(const std::string& given, const void* data, std::size_t size,
                       const std::string& mode_from) {
    const std::string path = resolved(given);
    // Not a regular file (/dev/null, /dev/stdout, a FIFO, a socket): written
    // into as a shell's `>` would; a rename would put a file in its place.
    struct stat existing {};
    if (::stat(path.c_str(), &existing) == 0 && !S_ISREG(existing.st_mode)) {
        UniqueFd out(::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_NOCTTY));
        if (!out) throw_errno("cannot open " + given);
        write_all(out.get(), data, size, [](const std::string& what) { throw_errno(what); }, given);
        return;
    }
    const std::string tmp = path + ".iprobe-tmp." + std::to_string(::getpid());
    mode_t mode = 0644;
    struct stat st {};
    const bool have_ref = !mode_from.empty() && ::stat(mode_from.c_str(), &st) == 0;
    if (have_ref) mode = st.st_mode & 07777;

    UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (!fd) throw_errno("cannot create " + tmp);
    auto fail = [&](const std::string& what) {
        const int err = errno;
        ::unlink(tmp.c_str());
        errno = err;
        throw_errno(what);
    };
    write_all(fd.get(), data, size, fail, tmp);
    if (have_ref && ::fchown(fd.get(), st.st_uid, st.st_gid) != 0 && errno != EPERM)
        fail("cannot chown " + tmp);
    if (::fchmod(fd.get(), mode) != 0) fail("cannot chmod " + tmp);
    if (::fsync(fd.get()) != 0) fail("cannot fsync " + tmp);
    fd.reset();
    if (::rename(tmp.c_str(), path.c_str()) != 0) fail("cannot rename " + tmp + " to " + path);
}

}  // namespace iprobe
