// `iprobe run`: a program started with its probes on before any code of its
// own runs, its whole run reported as `iprobe report --at-exit` would.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <signal.h>

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

// `iprobe run --module LIB` of a library the program dlopens after it
// started (targets/dlopen_target.c, dlopen_lib.c): probed as it loads,
// before its constructor runs, without one of its calls missed.
std::string dl_dir() { return targets_dir() + "/dlopen"; }
std::string dl_target() { return dl_dir() + "/dlopen_target"; }
std::string dl_lib(const std::string& name) { return dl_dir() + "/libiprobe_dl_" + name + ".so"; }
std::string dl_spec(const std::string& name) { return dl_lib(name) + ":dl_work_" + name; }

TEST(IprobeRunDlopen, ALibraryLoadedLaterIsProbedFromItsConstructorOn) {
    const auto r = iprobe({"run", "--module", "libiprobe_dl_a.so", "--handler", "count", "--json", "--", dl_target(),
                           "1000", dl_spec("a")});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("done "), std::string::npos) << r.out;
    // its 1000 calls from the program and the one its constructor makes
    EXPECT_EQ(json_calls(r.err, "dl_work_a"), 1001) << r.err;
    EXPECT_EQ(json_calls(r.err, "at_load"), 1) << r.err;
    EXPECT_EQ(json_number(r.err, "lost"), 0) << r.err;
    EXPECT_EQ(r.err.find("never_loaded"), std::string::npos) << r.err;
}

// One module loaded at start (linked), two later from threads that dlopen
// at once, one of them named by its probe list (--probes).
TEST(IprobeRunDlopen, ModulesAtStartAndLoadedByConcurrentThreadsAreAllCounted) {
    const auto r = iprobe({"run", "--module", "libiprobe_dl_start.so,libiprobe_dl_a.so", "--probes",
                           dl_lib("b") + ".probes", "--functions", "*_work*", "--handler", "count", "--json", "--",
                           dl_target(), "--threads", "300", dl_spec("a"), dl_spec("b")});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("done "), std::string::npos) << r.out;
    // 300 from the program, one from its constructor: the runtime's hold
    // (initfirst) comes before the constructors of the libraries linked at start
    EXPECT_EQ(json_calls(r.err, "start_work"), 301) << r.err;
    EXPECT_EQ(json_calls(r.err, "dl_work_a"), 301) << r.err;
    EXPECT_EQ(json_calls(r.err, "dl_work_b"), 301) << r.err;
}

// Once nothing is pending, at the start or after the last pending module
// loaded, the program sees what it sees under a run that names no module
// (the region's descriptor, none left open for later loads, LD_AUDIT as it
// was), and a later dlopen of another library is not held.
TEST(IprobeRunDlopen, NothingPendingLeavesTheProgramAsARunOfTheExecutable) {
    const auto plain = iprobe({"run", "--functions", "main", "--handler", "count", "--", dl_target(), "--fds", "5",
                               dl_spec("a")});
    ASSERT_EQ(plain.exit_code, 0) << plain.err;
    EXPECT_NE(plain.out.find("audit (unset) libc 1\n"), std::string::npos) << plain.out;
    const auto at_start = iprobe({"run", "--module", "libiprobe_dl_start.so", "--handler", "count", "--json", "--",
                                  dl_target(), "--fds", "5", dl_spec("a")});
    EXPECT_EQ(at_start.exit_code, 0) << at_start.err;
    EXPECT_EQ(at_start.out, plain.out) << "open descriptors and LD_AUDIT as in a run of the executable";
    EXPECT_EQ(json_calls(at_start.err, "start_work"), 5 + 1) << "and its constructor's: " << at_start.err;
    EXPECT_EQ(json_calls(at_start.err, "at_load"), 1) << at_start.err;
    EXPECT_EQ(json_calls(at_start.err, "dl_work_a"), -1) << "not asked for: " << at_start.err;
    const auto later = iprobe({"run", "--module", "libiprobe_dl_a.so", "--handler", "count", "--json", "--",
                               dl_target(), "--fds", "5", dl_spec("a")});
    EXPECT_EQ(later.exit_code, 0) << later.err;
    EXPECT_EQ(later.out, plain.out) << "the audit module's descriptor closed once libiprobe_dl_a.so loaded, and "
                                       "no second libc came with it";
    EXPECT_EQ(json_calls(later.err, "dl_work_a"), 6) << later.err;
}

// dlmopen into a new namespace (with its own copy of libc) goes through
// the same loader checkpoint.
TEST(IprobeRunDlopen, ALibraryLoadedIntoANewNamespaceByDlmopenIsProbedToo) {
    const auto r = iprobe({"run", "--module", "libiprobe_dl_a.so", "--handler", "count", "--json", "--", dl_target(),
                           "--dlmopen", "100", dl_spec("a")});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("done "), std::string::npos) << r.out;
    EXPECT_EQ(json_calls(r.err, "dl_work_a"), 101) << r.err;
    EXPECT_EQ(json_calls(r.err, "at_load"), 1) << r.err;
}

// --functions meant for a library still to come matches nothing in the one
// loaded at start: that is said, and the program goes on to load the other.
TEST(IprobeRunDlopen, FunctionsOnlyInALaterModuleDoNotStopTheProgramAtItsStart) {
    const auto r = iprobe({"run", "--module", "libiprobe_dl_start.so,libiprobe_dl_a.so", "--functions", "dl_work_*",
                           "--handler", "count", "--json", "--", dl_target(), "10", dl_spec("a")});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("done "), std::string::npos) << r.out;
    EXPECT_NE(r.err.find("iprobe run: --module libiprobe_dl_start.so loaded by process "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("but not probed: no probe matches dl_work_*"), std::string::npos) << r.err;
    EXPECT_EQ(json_calls(r.err, "dl_work_a"), 11) << r.err;
    EXPECT_EQ(json_calls(r.err, "start_work"), -1) << r.err;
}

TEST(IprobeRunDlopen, AModuleNeverLoadedIsSaidAtExit) {
    const auto r = iprobe({"run", "--module", "libiprobe_dl_a.so,libiprobe_dl_never.so", "--handler", "count",
                           "--json", "--", dl_target(), "10", dl_spec("a")});
    EXPECT_EQ(r.exit_code, 0) << "something was probed: the program's status " << r.err;
    EXPECT_EQ(json_calls(r.err, "dl_work_a"), 11) << r.err;
    EXPECT_NE(r.err.find("iprobe run: --module libiprobe_dl_never.so was never loaded by process "), std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find("none of its functions were probed\n"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("\"never_loaded\":[\"libiprobe_dl_never.so\"]"), std::string::npos) << r.err;
}

TEST(IprobeRunDlopen, NothingLoadedAtAllExitsNotFoundAfterTheProgramRan) {
    const auto r = iprobe({"run", "--module", "libiprobe_dl_never.so", "--handler", "count", "--", dl_target(), "10",
                           dl_spec("a")});
    EXPECT_EQ(r.exit_code, 5) << r.err;
    EXPECT_NE(r.out.find("done "), std::string::npos) << "the program ran, unprobed: " << r.out;
    EXPECT_NE(r.err.find("--module libiprobe_dl_never.so was never loaded"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("never loaded: libiprobe_dl_never.so"), std::string::npos) << "in the report: " << r.err;
    EXPECT_NE(r.err.find("iprobe run: nothing was probed in process "), std::string::npos) << r.err;
}

// A fork()ed child loads the library first: it is not probed (as every
// child of fork), says nothing on the channel and is not held; the
// parent's own load afterwards is probed.
TEST(IprobeRunDlopen, AForkedChildsLoadIsNotHeldAndTheParentsIs) {
    const auto r = iprobe({"run", "--module", "libiprobe_dl_a.so", "--handler", "count", "--json", "--", dl_target(),
                           "--fork", "50", dl_spec("a")});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(json_calls(r.err, "dl_work_a"), 51) << r.err;
}

// A program that execs another (a wrapper script, pyenv's shims): what it
// exec'd runs without the runtime, so its loads are not probed; the
// never-loaded message says what it exec'd (seen while it runs: it sleeps).
TEST(IprobeRunDlopen, AProgramThatExecsAnotherSaysSoWithTheModuleNeverLoaded) {
    const auto r = iprobe({"run", "--module", "libiprobe_dl_a.so", "--handler", "count", "--", "/bin/sh", "-c",
                           "echo started; exec /bin/sleep 0.5"});
    EXPECT_EQ(r.exit_code, 5) << r.err;
    EXPECT_EQ(r.out, "started\n");
    EXPECT_NE(r.err.find("--module libiprobe_dl_a.so was never loaded by process "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("none of its functions were probed; it exec'd /"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("sleep, which ran without probes\n"), std::string::npos) << r.err;
}

TEST(IprobeRunDlopen, ExecModeProbesALaterLoadToo) {
    TempDir dir;
    const auto r = iprobe({"run", "--exec", "--module", "libiprobe_dl_a.so", "--handler", "count", "--json", "--report",
                           dir / "run.%p.json", "--", dl_target(), "20", dl_spec("a")});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    std::string report;
    for (int i = 0; i < 200 && report.empty(); ++i) {
        for (const auto& e : std::filesystem::directory_iterator(dir.path()))
            if (e.path().extension() == ".json") report = file_text(e.path());
        if (report.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ASSERT_FALSE(report.empty()) << "no report: " << r.err;
    EXPECT_EQ(json_calls(report, "dl_work_a"), 21) << report;
}

// iprobe gone (SIGKILL) while the program waits inside dlopen for it: the
// program goes on, unprobed, and finishes.
TEST(IprobeRunDlopen, AProgramHeldInDlopenGoesOnWhenIprobeIsKilled) {
    TempDir dir;
    const std::string go = dir / "go", out = dir / "out";
    Child run_cmd({iprobe_bin(), "run", "--module", "libiprobe_dl_a.so", "--handler", "count", "--", dl_target(),
                   "--wait", go, "10", dl_spec("a")},
                  out);
    pid_t program = 0;
    for (int i = 0; i < 400 && program == 0; ++i) {
        const std::string children =
            file_text("/proc/" + std::to_string(run_cmd.pid()) + "/task/" + std::to_string(run_cmd.pid()) + "/children");
        if (!children.empty()) program = static_cast<pid_t>(std::stol(children));
        else std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    ASSERT_NE(program, 0) << "iprobe run started no program";
    // Past its start's hold (iprobe killed there ends the program: it never
    // runs without the probes it was promised), waiting for `go`.
    const std::string wchan = "/proc/" + std::to_string(program) + "/wchan";
    bool waiting = false;
    for (int i = 0; i < 400 && !waiting; ++i) {
        waiting = file_text(wchan).find("nanosleep") != std::string::npos;
        if (!waiting) std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    ASSERT_TRUE(waiting) << "the program did not get past its start (wchan " << file_text(wchan) << ")";
    // iprobe stopped: the program's load waits for it, inside dlopen
    ::kill(run_cmd.pid(), SIGSTOP);
    std::ofstream(go) << "go";
    bool held = false;
    for (int i = 0; i < 400 && !held; ++i) {
        held = file_text(wchan).find("unix_stream_read") != std::string::npos;
        if (!held) std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    EXPECT_TRUE(held) << "the program was not held in its dlopen (wchan " << file_text(wchan) << ")";
    run_cmd.kill(SIGKILL);
    run_cmd.wait();
    bool gone = false;
    for (int i = 0; i < 400 && !gone; ++i) {
        gone = !std::filesystem::exists("/proc/" + std::to_string(program));
        if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    EXPECT_TRUE(gone) << "the program is stuck without iprobe";
    EXPECT_NE(file_text(out).find("done "), std::string::npos) << file_text(out);
}

}  // namespace
}  // namespace iprobe::test
