// Errors that name the real cause, input files checked before they are
// read, and Ctrl-C that ends every command at once.
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "hotpatch_fixture.h"

namespace iprobe::test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A kernel thread this test can see (PF_KTHREAD in /proc/PID/stat), or 0.
pid_t a_kernel_thread() {
    for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
        const std::string name = entry.path().filename();
        if (name.find_first_not_of("0123456789") != std::string::npos) continue;
        const std::string stat = file_text(entry.path() / "stat");
        const auto paren = stat.rfind(')');
        if (paren == std::string::npos) continue;
        std::istringstream fields(stat.substr(paren + 2));
        std::string field;
        for (int i = 3; fields >> field; i++)
            if (i == 9) {
                if (std::stoul(field) & 0x00200000) return std::stoi(name);
                break;
            }
    }
    return 0;
}

// One line on stderr, no C++ library text.
void expect_plain(const CommandResult& r, const std::string& wanted) {
    EXPECT_NE(r.err.find(wanted), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("basic_"), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

TEST(Messages, AKernelThreadIsNamedAsOne) {
    const pid_t kthread = a_kernel_thread();
    if (!kthread) GTEST_SKIP() << "no kernel thread visible in this PID namespace";
    for (const char* command : {"attach", "status", "detach"}) {
        const auto r = iprobe({command, std::to_string(kthread)});
        EXPECT_EQ(r.exit_code, 3) << command << ": " << r.err;
        expect_plain(r, "is a kernel thread");
    }
    if (!is_root()) return;
    const auto clone = iprobe({"clone", std::to_string(kthread)});
    EXPECT_EQ(clone.exit_code, 3) << clone.err;
    EXPECT_NE(clone.err.find("is a kernel thread"), std::string::npos) << clone.err;
}

// A process whose main thread called pthread_exit runs on its other
// threads, but its /proc/PID maps, mem and exe are empty: said as that, not
// as "a zombie" with "nothing runs in it", and nothing is changed.
TEST(Messages, AProcessWhoseMainThreadExitedIsNamedAsOne) {
    const pid_t child = ::fork();
    if (child == 0) {
        pthread_t thread;
        ::pthread_create(&thread, nullptr, [](void*) -> void* {
            for (;;) ::pause();
        }, nullptr);
        ::syscall(SYS_exit, 0);  // this thread alone, without unwinding into gtest (pthread_exit would)
    }
    const std::string proc = "/proc/" + std::to_string(child);
    for (int i = 0; i < 5000 && (file_text(proc + "/stat").find(") Z") == std::string::npos ||
                                 std::distance(std::filesystem::directory_iterator(proc + "/task"),
                                               std::filesystem::directory_iterator{}) != 2);
         i++)
        std::this_thread::sleep_for(1ms);
    const auto attach = iprobe({"attach", std::to_string(child)});
    EXPECT_EQ(attach.exit_code, 3) << attach.err;
    expect_plain(attach, "main thread has exited, but 1 other thread(s) still run in it");
    EXPECT_EQ(attach.err.find("nothing runs in it"), std::string::npos) << attach.err;
    ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
}

TEST(Messages, AZombieIsNamedAsOne) {
    const pid_t child = ::fork();
    if (child == 0) ::_exit(0);
    while (file_text("/proc/" + std::to_string(child) + "/stat").find(") Z") == std::string::npos)
        std::this_thread::sleep_for(1ms);
    const auto attach = iprobe({"attach", std::to_string(child)});
    EXPECT_EQ(attach.exit_code, 5) << attach.err;
    expect_plain(attach, "is a zombie");
    if (is_root()) {
        const auto clone = iprobe({"clone", std::to_string(child)});
        EXPECT_EQ(clone.exit_code, 5) << clone.err;
        EXPECT_NE(clone.err.find("is a zombie"), std::string::npos) << clone.err;
        EXPECT_EQ(clone.err.find("network namespace"), std::string::npos) << clone.err;
    }
    ::waitpid(child, nullptr, 0);
}

TEST(Messages, AnUnknownOptionShowsTheCommandsOwnUsage) {
    for (const std::string command : {"attach", "detach", "status", "trace", "report"}) {
        const auto r = iprobe({command, "1", "--bogus"});
        EXPECT_EQ(r.exit_code, 2) << command;
        EXPECT_NE(r.err.find("usage: iprobe " + command), std::string::npos) << r.err;
        if (command != "attach") {
            EXPECT_EQ(r.err.find("iprobe attach"), std::string::npos) << r.err;
        }
    }
}

TEST(Messages, CaptureWithoutACopyIsAUsageError) {
    const auto started = Clock::now();
    const auto r = iprobe({"mirror", "--capture", "lo:6379"}, 10s);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find("--capture needs --debug"), std::string::npos) << r.err;
    EXPECT_LT(Clock::now() - started, 2s);
}

// FIFOs, devices and directories are refused before anything is read: no
// open that waits for a writer, no endless read.
TEST(Messages, InputFilesAreCheckedBeforeTheyAreRead) {
    TempDir dir;
    const std::string fifo = dir / "fifo";
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    struct Case {
        std::vector<std::string> args;
        std::string says;
    };
    const std::vector<Case> cases = {
        {{"trace", "--input", "/dev/zero"}, "not a regular file (a device or socket)"},
        {{"trace", "--input", fifo}, "not a regular file (a FIFO)"},
        {{"trace", "--input", dir.path()}, "not a regular file (a directory)"},
        {{"list", fifo}, "not a regular file (a FIFO)"},
        {{"attach", std::to_string(::getpid()), "--probes", fifo}, "not a regular file (a FIFO)"},
    };
    for (const auto& c : cases) {
        const auto started = Clock::now();
        const auto r = iprobe(c.args, 10s);
        std::string what;
        for (const auto& a : c.args) what += " " + a;
        EXPECT_LT(Clock::now() - started, 2s) << what;
        EXPECT_EQ(r.exit_code, 3) << what << ": " << r.err;
        expect_plain(r, c.says);
    }
}

// A tool started in the background, SIGINTed once running.
int interrupted_after(const std::vector<std::string>& args, std::chrono::milliseconds running_for,
                      std::chrono::milliseconds& took) {
    std::vector<std::string> argv{iprobe_bin()};
    argv.insert(argv.end(), args.begin(), args.end());
    Child tool(argv);
    std::this_thread::sleep_for(running_for);
    const auto sent = Clock::now();
    ::kill(tool.pid(), SIGINT);
    while (tool.running() && Clock::now() - sent < 10s) std::this_thread::sleep_for(1ms);
    took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - sent);
    return tool.wait(1s);
}

TEST(Messages, SigintEndsEveryLongCommandWithinASecond) {
    if (!is_root()) GTEST_SKIP() << "needs root (ptrace)";
    TempDir dir;
    // 2 GiB of valid events (zeros: entries of probe 0), sparse on disk.
    const std::string big = dir / "big.trace";
    {
        std::ofstream out(big, std::ios::binary);
        const char head[24] = {'I', 'P', 'R', 'B', 'T', 'R', 'C', '1', 1};
        out.write(head, sizeof head);
    }
    const std::uint64_t table_at = 24 + (2ull << 30);
    ASSERT_EQ(::truncate(big.c_str(), static_cast<off_t>(table_at)), 0);
    {
        std::ofstream out(big, std::ios::binary | std::ios::app);
        const std::uint32_t no_probes = 0;
        out.write(reinterpret_cast<const char*>(&no_probes), 4);
        const std::uint64_t at = table_at;
        out.write(reinterpret_cast<const char*>(&at), 8);
        out.write("IPRBEND1", 8);
    }
    HpTarget target(2);
    const std::string pid = std::to_string(target.pid());
    ASSERT_EQ(iprobe({"attach", pid}).exit_code, 0);
    for (const std::vector<std::string>& args :
         {std::vector<std::string>{"trace", "--input", big}, {"trace", pid}, {"report", pid, "--duration", "100"},
          {"report", pid, "--at-exit"}, {"report", pid, "--folded", "--duration", "100"}}) {
        std::chrono::milliseconds took{};
        const int code = interrupted_after(args, 500ms, took);
        std::string what;
        for (const auto& a : args) what += " " + a;
        EXPECT_LT(took, 1000ms) << what;
        EXPECT_NE(code, -1) << what << ": not ended by SIGINT";
    }
}

}  // namespace
}  // namespace iprobe::test
