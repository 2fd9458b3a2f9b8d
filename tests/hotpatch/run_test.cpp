// `iprobe run`: a program started with its probes on before any code of its
// own runs, its whole run reported as `iprobe report --at-exit` would.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "hotpatch_fixture.h"

namespace iprobe::test {
namespace {

std::string target() { return targets_dir() + "/run_target"; }

// The file once `iprobe run --exec`'s helper has written it (it does so
// after the program exited); "" if it never appears.
std::string wait_for_file(const std::string& path) {
    for (int i = 0; i < 200; ++i) {
        if (std::filesystem::exists(path)) return file_text(path);
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return {};
}

TEST(IprobeRun, CountsEveryCallFromTheFirstConstructorOnAndExitsAsTheProgramDid) {
    const auto r = iprobe({"run", "--handler", "count", "--completed", "--json", "--", target(), "1000", "3"});
    EXPECT_EQ(r.exit_code, 3) << r.err;
    EXPECT_NE(r.out.find("preload (unset)"), std::string::npos) << "LD_PRELOAD is as iprobe found it: " << r.out;
    // the report is iprobe report's, on stderr: the constructor's call and main's
    EXPECT_EQ(json_calls(r.err, "leaf"), 1001) << r.err;
    EXPECT_EQ(json_calls(r.err, "main"), 1) << r.err;
    EXPECT_EQ(json_completed(r.err, "main"), 1) << r.err;
    EXPECT_EQ(json_number(r.err, "lost"), 0) << r.err;
}

TEST(IprobeRun, ExecKeepsThePidAndWritesTheReportAfterTheProgramExits) {
    TempDir dir;
    const auto r = iprobe({"run", "--exec", "--handler", "count", "--json", "--report", dir / "run.%p.json", "--",
                           target(), "10"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    const auto at = r.out.find("pid ");
    ASSERT_NE(at, std::string::npos) << r.out;
    const std::string pid = std::to_string(std::stol(r.out.substr(at + 4)));
    const std::string report = wait_for_file(dir / ("run." + pid + ".json"));
    ASSERT_FALSE(report.empty()) << "no report for the program's own PID " << pid;
    EXPECT_EQ(json_number(report, "pid"), std::stol(pid));
    EXPECT_EQ(json_calls(report, "leaf"), 11) << report;
}

TEST(IprobeRun, KeepsTheUsersOwnPreload) {
    const std::string libm = "/lib/x86_64-linux-gnu/libm.so.6";
    if (!std::filesystem::exists(libm)) GTEST_SKIP() << libm << " not found";
    const auto r = run({bin("iprobe"), "run", "--handler", "count", "--", target(), "1"}, {}, std::chrono::seconds(60),
                       {"LD_PRELOAD=" + libm});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("preload " + libm + "\n"), std::string::npos) << r.out;
}

// bash defines its own getenv, setenv and unsetenv (over its shell
// variables, set up by its main): the runtime's hold took LD_PRELOAD and
// its channel out through them, which did nothing, and every command bash
// then ran inherited both, found the channel closed and exited 1 unrun.  The
// hold edits the environment in place: bash's commands run as without
// iprobe, with the user's own LD_PRELOAD, while bash itself is probed.
TEST(IprobeRun, ACommandBashRunsRunsAsWithoutIprobe) {
    const std::string command = target() + " 2 7; echo exit $?";
    auto r = iprobe({"run", "--handler", "count", "--json", "--", "bash", "-c", command});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find(" preload (unset)\nexit 7\n"), std::string::npos) << r.out;
    EXPECT_EQ(json_calls(r.err, "make_child"), 1) << "bash is probed: " << r.err.substr(0, 2000);

    const std::string libm = "/lib/x86_64-linux-gnu/libm.so.6";
    if (!std::filesystem::exists(libm)) GTEST_SKIP() << libm << " not found";
    r = run({bin("iprobe"), "run", "--handler", "count", "--", "bash", "-c", command}, {}, std::chrono::seconds(60),
            {"LD_PRELOAD=" + libm});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find(" preload " + libm + "\nexit 7\n"), std::string::npos) << r.out;
}

TEST(IprobeRun, ProbesThatCannotBeEnabledStopTheProgramBeforeItRuns) {
    const auto r = iprobe({"run", "--functions", "no_such_function*", "--", target(), "1"});
    EXPECT_EQ(r.exit_code, 5) << r.err;
    EXPECT_NE(r.err.find("no probe matches"), std::string::npos) << r.err;
    EXPECT_EQ(r.out, "") << "none of the program's code ran";
}

// A tail call whose caller and callee both hook the one return slot chains
// their return entries; an exception thrown through both must still find
// its handler (each unit of the chain a frame with a CFA of its own).
TEST(IprobeRun, AnExceptionThroughAHookedTailCallIsCaught) {
    const std::string program = targets_dir() + "/tail_throw";
    const auto list = run({bin("iprobe"), "list", program, "--functions", "outer*", "--kind", "exit", "--count"});
    ASSERT_EQ(list.out, "1\n") << list.err;
    const auto r = iprobe({"run", "--handler", "count", "--completed", "--json", "--", program, "3"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, "caught 3\n");
    // (json_calls takes a regular expression)
    EXPECT_EQ(json_calls(r.err, "outer\\(int\\)"), 3) << r.err;
    EXPECT_EQ(json_calls(r.err, "inner\\(unsigned int\\)"), 3) << r.err;
    EXPECT_EQ(json_completed(r.err, "inner\\(unsigned int\\)"), 0) << "thrown out of, never returned: " << r.err;
}

TEST(IprobeRun, AProgramThatCannotBeRunIsReportedAsShellsDo) {
    const auto r = iprobe({"run", "--", "/nonexistent/program"});
    EXPECT_EQ(r.exit_code, 127) << r.err;
    EXPECT_NE(r.err.find("cannot run /nonexistent/program"), std::string::npos) << r.err;
    const auto usage = iprobe({"run", "--handler", "count"});
    EXPECT_EQ(usage.exit_code, 2) << usage.err;
}

}  // namespace
}  // namespace iprobe::test
