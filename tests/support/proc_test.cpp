#include <sys/prctl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "iprobe/support/error.h"
#include "iprobe/support/install_layout.h"
#include "iprobe/support/proc.h"

namespace iprobe {
namespace {

namespace fs = std::filesystem;

TEST(Proc, MapsHoldThisCodeExecutableAndFileBacked) {
    const auto here = reinterpret_cast<std::uint64_t>(&proc::read_maps);
    const auto maps = proc::read_maps(::getpid());
    const auto self = fs::read_symlink("/proc/self/exe").string();
    int holding = 0;
    for (const auto& m : maps)
        if (here >= m.start && here < m.end) {
            ++holding;
            EXPECT_TRUE(m.executable()) << m.perms;
            EXPECT_TRUE(m.file_backed());
            EXPECT_EQ(m.path, self);
        }
    EXPECT_EQ(holding, 1);
    EXPECT_TRUE(std::any_of(maps.begin(), maps.end(), [](const auto& m) { return m.path == "[stack]"; }));
}

TEST(Proc, AGoneProcessIsNotFound) {
    pid_t child = ::fork();
    if (child == 0) _exit(0);
    ASSERT_GT(child, 0);
    int status = 0;
    ::waitpid(child, &status, 0);
    try {
        proc::read_maps(child);
        ADD_FAILURE() << "read the maps of a reaped process";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ExitCode::not_found);
    }
    EXPECT_TRUE(proc::threads(child).empty());
    EXPECT_EQ(proc::state(child), 0);
    EXPECT_FALSE(proc::status_field(child, "Name"));
}

TEST(Proc, ThreadsStatusAndStatAgreeWithTheKernel) {
    std::atomic<bool> stop{false};
    std::atomic<pid_t> worker_tid{0};
    std::thread worker([&] {
        worker_tid = ::gettid();
        while (!stop) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
    while (!worker_tid) std::this_thread::yield();
    const auto tids = proc::threads(::getpid());
    EXPECT_EQ(tids, (std::vector<pid_t>{::getpid(), worker_tid.load()}));
    stop = true;
    worker.join();

    EXPECT_EQ(proc::status_numbers(::getpid(), "NSpid").back(), ::getpid());
    EXPECT_EQ(proc::status_field(::getpid(), "Tgid"), std::to_string(::getpid()));
    EXPECT_FALSE(proc::status_field(::getpid(), "NoSuchField"));
    EXPECT_FALSE(proc::status_field(::getpid(), "Tgi"));  // a prefix of a key is not the key
    EXPECT_EQ(proc::stat_field(::getpid(), 1), std::to_string(::getpid()));
    EXPECT_EQ(proc::state(::getpid()), 'R');
    EXPECT_EQ(proc::stat_field(::getpid(), 4), std::to_string(::getppid()));
}

// A command name may hold ") (": fields are counted after the last ')'.
TEST(Proc, StatFieldsSurviveACommandNameWithParentheses) {
    int ready[2];
    ASSERT_EQ(::pipe(ready), 0);
    pid_t child = ::fork();
    if (child == 0) {
        ::prctl(PR_SET_NAME, "a) S (b", 0, 0, 0);
        (void)!::write(ready[1], "x", 1);
        ::pause();
        _exit(0);
    }
    char byte;
    ASSERT_EQ(::read(ready[0], &byte, 1), 1);
    EXPECT_EQ(proc::stat_field(child, 2), "a) S (b");
    EXPECT_EQ(proc::stat_field(child, 4), std::to_string(::getpid()));
    // Between its write and pause() it may still be running.
    char state = 0;
    for (int i = 0; i < 1000 && (state = proc::state(child, child)) != 'S'; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_EQ(state, 'S');
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
    ::close(ready[0]);
    ::close(ready[1]);
}

class InstallLayoutTest : public ::testing::Test {
protected:
    void SetUp() override {
        root_ = fs::temp_directory_path() / ("iprobe-layout-" + std::to_string(::getpid()));
        fs::remove_all(root_);
    }
    void TearDown() override { fs::remove_all(root_); }
    void touch(const fs::path& p, fs::perms perms = fs::perms::owner_read | fs::perms::owner_write) {
        fs::create_directories(p.parent_path());
        std::ofstream(p) << "x";
        fs::permissions(p, perms);
    }
    fs::path root_;
};

TEST_F(InstallLayoutTest, ToolsHelpersAndTestsOfOneTreeShareItsPrefix) {
    const fs::path prefix = root_ / "build";
    fs::create_directories(prefix / "libexec" / "iprobe");
    for (const fs::path& exe : {prefix / "bin" / "iprobe", prefix / "libexec" / "iprobe" / "iprobe-hotpatch",
                               prefix / "tests" / "launcher" / "some_test"})
        EXPECT_EQ(InstallLayout::of_executable(exe).prefix(), prefix) << exe;
    // A runtime library alone marks a prefix too.
    touch(root_ / "other" / "lib" / "libiprobe-rt.so");
    EXPECT_EQ(InstallLayout::of_executable(root_ / "other" / "bin" / "fperf").prefix(), root_ / "other");
    // Nothing of ours anywhere: bin/'s parent, as for /usr/bin.
    EXPECT_EQ(InstallLayout::of_executable("/nonexistent/usr/bin/tool").prefix(), "/nonexistent/usr");
}

TEST_F(InstallLayoutTest, HelpersMustBeExecutableAndLibrariesAreFoundInLibOrLibIprobe) {
    const InstallLayout layout(root_);
    touch(layout.libexec() / "not-executable");
    touch(layout.libexec() / "tool", fs::perms::owner_all);
    EXPECT_FALSE(layout.helper("not-executable"));
    EXPECT_FALSE(layout.helper("missing"));
    EXPECT_EQ(layout.helper("tool"), layout.libexec() / "tool");
    touch(layout.lib() / "iprobe" / "libnested.so");
    touch(layout.lib() / "libtop.so");
    EXPECT_EQ(layout.library("libnested.so"), layout.lib() / "iprobe" / "libnested.so");
    EXPECT_EQ(layout.library("libtop.so"), layout.lib() / "libtop.so");
    EXPECT_FALSE(layout.library("libnone.so"));
}

}  // namespace
}  // namespace iprobe
