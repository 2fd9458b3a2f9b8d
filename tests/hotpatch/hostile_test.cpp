// A target that corrupts its own iprobe region, running as an unprivileged
// user (nobody), and root's readers of that region: status, report, trace
// (and report --folded) must each end within 10 s using under 100 MB, and
// detach must give the code back byte for byte as the file holds it, whatever
// the region says (targets/hostile_target.c: eight ways of corrupting it, the
// issue's among them).  IPROBE_HOSTILE_RUNS sets the number of targets
// (default 50).
//
// Everything the unprivileged target needs (its binary and probe list, the
// runtime that attach injects) is copied to a directory it can reach: the
// checkout may sit under a home directory of mode 0700.
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "hotpatch_fixture.h"

namespace iprobe::test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr auto kToolLimit = 10s;
constexpr long kRssLimitKb = 100 * 1024;

int runs() {
    const char* env = std::getenv("IPROBE_HOSTILE_RUNS");
    return env && *env ? std::atoi(env) : 50;
}

struct Measured {
    int exit_code = -1;  // -1: killed at the limit, or by a signal
    double seconds = 0;
    long max_rss_kb = 0;
    std::string err;
};

// Runs a tool with stdout thrown away, killed at kToolLimit; its peak RSS
// from wait4 (the tool and whatever it ran and waited for).
Measured measure(const std::vector<std::string>& argv, const std::string& err_path) {
    const auto started = Clock::now();
    const pid_t pid = ::fork();
    if (pid == 0) {
        const int null = ::open("/dev/null", O_WRONLY);
        const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
        ::dup2(null, 1);
        ::dup2(err, 2);
        std::vector<char*> args;
        for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
        args.push_back(nullptr);
        ::execv(args[0], args.data());
        ::_exit(127);
    }
    Measured m;
    int status = 0;
    rusage usage{};
    for (;;) {
        const pid_t r = ::wait4(pid, &status, WNOHANG, &usage);
        if (r == pid) break;
        if (Clock::now() - started > kToolLimit) {
            ::kill(pid, SIGKILL);
            ::wait4(pid, &status, 0, &usage);
            break;
        }
        std::this_thread::sleep_for(2ms);
    }
    m.seconds = std::chrono::duration<double>(Clock::now() - started).count();
    m.max_rss_kb = usage.ru_maxrss;
    m.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    m.err = file_text(err_path);
    return m;
}

// Do the executable mappings of `file` in `pid` hold exactly its bytes?
bool code_is_the_file(pid_t pid, const std::string& file) {
    std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
    const int mem = ::open(("/proc/" + std::to_string(pid) + "/mem").c_str(), O_RDONLY);
    const int disk = ::open(file.c_str(), O_RDONLY);
    bool seen = false, same = mem >= 0 && disk >= 0;
    std::string line;
    while (same && std::getline(maps, line)) {
        std::istringstream f(line);
        std::string range, perms, offset, dev, inode, path;
        f >> range >> perms >> offset >> dev >> inode >> path;
        if (path != file || perms.find('x') == std::string::npos) continue;
        const std::uint64_t start = std::stoull(range.substr(0, range.find('-')), nullptr, 16);
        const std::uint64_t end = std::stoull(range.substr(range.find('-') + 1), nullptr, 16);
        std::vector<char> live(end - start), want(end - start);
        const ssize_t got = ::pread(mem, live.data(), live.size(), static_cast<off_t>(start));
        const ssize_t read = ::pread(disk, want.data(), want.size(), static_cast<off_t>(std::stoull(offset, nullptr, 16)));
        if (got <= 0 || read <= 0) same = false;
        else same = std::equal(live.begin(), live.begin() + std::min(got, read), want.begin());
        seen = true;
    }
    if (mem >= 0) ::close(mem);
    if (disk >= 0) ::close(disk);
    return seen && same;
}

class HostileTest : public ::testing::Test {
protected:
    void SetUp() override {
        if (!is_root()) GTEST_SKIP() << "needs root (to run the target as nobody and read it as root)";
        ::chmod(dir_.path().c_str(), 0755);
        for (const std::string& name : {std::string("hostile_target"), std::string("hostile_target.probes")})
            std::filesystem::copy_file(targets_dir() + "/" + name, dir_ / name);
        std::filesystem::copy_file(build_dir() + "/lib/libiprobe-rt.so", dir_ / "libiprobe-rt.so");
        for (const char* name : {"hostile_target", "libiprobe-rt.so"}) ::chmod((dir_ / name).c_str(), 0755);
        ::chmod((dir_ / "hostile_target.probes").c_str(), 0644);
    }
    TempDir dir_;
};

TEST_F(HostileTest, RootsReadersStayBoundedAndDetachRestoresTheCode) {
    const std::vector<std::string> modes = {"add", "small", "control", "counts", "tables", "rings", "threads", "bytes"};
    const std::string binary = dir_ / "hostile_target";
    const int total = runs();
    int slow = 0, large = 0, crashed = 0, not_restored = 0;
    double slowest = 0;
    long largest = 0;
    for (int run = 0; run < total; run++) {
        const std::string mode = modes[static_cast<std::size_t>(run) % modes.size()];
        TempDir out;
        Child target({"/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", binary, mode,
                      std::to_string(run)},
                     out / "out");
        const auto until = Clock::now() + 20s;
        while (file_text(out / "out").find("ready") == std::string::npos && Clock::now() < until && target.running())
            std::this_thread::sleep_for(2ms);
        const std::string pid = std::to_string(target.pid());
        const auto a = iprobe({"attach", pid, "--runtime", dir_ / "libiprobe-rt.so"});
        ASSERT_EQ(a.exit_code, 0) << mode << " " << run << ": " << a.err;
        while (file_text(out / "out").find("corrupting") == std::string::npos && Clock::now() < until && target.running())
            std::this_thread::sleep_for(2ms);
        ASSERT_TRUE(target.running()) << mode << " " << run;
        std::this_thread::sleep_for(20ms);
        for (const std::vector<std::string>& command :
             {std::vector<std::string>{"status", pid}, {"status", pid, "--json"}, {"report", pid, "--json"},
              {"trace", pid, "--duration", "0.3"}, {"report", pid, "--folded", "--duration", "0.2"}, {"detach", pid}}) {
            std::vector<std::string> argv{iprobe_bin()};
            argv.insert(argv.end(), command.begin(), command.end());
            const Measured m = measure(argv, out / "err");
            std::string what = mode + " seed " + std::to_string(run) + ": iprobe";
            for (const auto& c : command) what += " " + c;
            slowest = std::max(slowest, m.seconds);
            largest = std::max(largest, m.max_rss_kb);
            if (m.exit_code == -1) {
                crashed++;
                ADD_FAILURE() << what << ": killed after " << m.seconds << " s (or by a signal): " << m.err;
            } else if (m.exit_code != 0 && m.exit_code != 3) {
                // 3: a region refused as unsound; anything else is not a hostile region's answer
                ADD_FAILURE() << what << ": exit " << m.exit_code << ": " << m.err;
            }
            if (m.seconds > 10) slow++;
            if (m.max_rss_kb > kRssLimitKb) {
                large++;
                ADD_FAILURE() << what << ": " << m.max_rss_kb / 1024 << " MB resident";
            }
            if (command.front() == "detach") {
                EXPECT_EQ(m.exit_code, 0) << what << ": " << m.err;
            }
        }
        if (!code_is_the_file(target.pid(), binary)) {
            not_restored++;
            ADD_FAILURE() << mode << " seed " << run << ": after detach the code differs from " << binary;
        }
    }
    std::printf("hostile regions: %d targets; slowest reader %.2f s, largest %ld MB; %d over 10 s, %d over 100 MB, "
                "%d killed, %d with code not restored\n",
                total, slowest, largest / 1024, slow, large, crashed, not_restored);
}

}  // namespace
}  // namespace iprobe::test
