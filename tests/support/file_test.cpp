// write_file_atomic: a regular file replaced whole; a link kept; what is no
// regular file (a device, a FIFO) written into, never replaced.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "iprobe/support/file.h"
#include "testutil.h"

namespace iprobe {
namespace {

namespace fs = std::filesystem;

std::string text_of(const std::string& path) {
    std::ifstream in(path);
    return {std::istreambuf_iterator<char>(in), {}};
}

void write(const std::string& path, const std::string& text) { write_file_atomic(path, text.data(), text.size()); }

TEST(WriteFileAtomic, ARegularFileIsReplacedWholeAndALinkKept) {
    test::TempDir dir;
    const std::string file = dir / "report.json", link = dir / "latest";
    write(file, "old");
    EXPECT_EQ(text_of(file), "old");
    fs::create_symlink(file, link);
    write(link, "new");
    EXPECT_TRUE(fs::is_symlink(link)) << "the link stays a link";
    EXPECT_EQ(text_of(file), "new") << "what it names is replaced";
    EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator{}), 2) << "no temp file left";
}

// `iprobe run --report /dev/null` put a regular file in /dev/null's place.
TEST(WriteFileAtomic, ADeviceIsWrittenIntoNotReplaced) {
    if (::geteuid() != 0) GTEST_SKIP() << "mknod of a character device needs root";
    test::TempDir dir;
    const std::string null = dir / "null";
    if (::mknod(null.c_str(), S_IFCHR | 0666, ::makedev(1, 3)) != 0)
        GTEST_SKIP() << "mknod refused here (" << std::strerror(errno) << "): no CAP_MKNOD";
    if (const int fd = ::open(null.c_str(), O_WRONLY | O_CLOEXEC); fd >= 0) ::close(fd);
    else GTEST_SKIP() << "a device in " << dir.path() << " cannot be opened (" << std::strerror(errno) << "): nodev";
    write(null, "a report nobody wants");
    struct stat st {};
    ASSERT_EQ(::stat(null.c_str(), &st), 0);
    EXPECT_TRUE(S_ISCHR(st.st_mode)) << "still the null device";
    EXPECT_EQ(::major(st.st_rdev), 1u);
    EXPECT_EQ(::minor(st.st_rdev), 3u);
}

TEST(WriteFileAtomic, AFifoGetsTheBytes) {
    test::TempDir dir;
    const std::string fifo = dir / "fifo";
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    std::string got;
    std::thread reader([&] { got = text_of(fifo); });
    write(fifo, "through the pipe");
    reader.join();
    EXPECT_EQ(got, "through the pipe");
    EXPECT_TRUE(fs::is_fifo(fifo));
}

}  // namespace
}  // namespace iprobe
