// iprobe attach/trace/report/detach on a live, coldpatched, multi-threaded
// target (tests/hotpatch/targets/hp_target.c, built with iprobe-cc).
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/ptrace.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <sys/stat.h>

#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "hotpatch_fixture.h"
#include "iprobe/formats/rt_layout.h"
#include "iprobe/formats/probe_list.h"
#include "iprobe/hotpatch/trace_file.h"
#include "iprobe/support/error.h"

namespace iprobe::test {
namespace {

namespace fs = std::filesystem;

constexpr int kThreads = 8;
constexpr long kBurst = 100000;
const std::string kBigRing = "262144";  // records per thread: one burst (entry + exit) fits

std::string pid_of(HpTarget& t) { return std::to_string(t.pid()); }

class HotpatchTest : public ::testing::Test {
protected:
    void SetUp() override {
        if (!is_root()) GTEST_SKIP() << "needs root (ptrace of any process, /run/iprobe)";
    }
};

TEST_F(HotpatchTest, InjectsRuntimeTracesExactCountsAndDetachesToIdenticalText) {
    HpTarget target(kThreads);
    const auto text_before = text_of(target.pid(), "/hp_target");
    ASSERT_FALSE(text_before.empty());
    // started without any preload: the runtime is not there yet
    EXPECT_EQ(file_text("/proc/" + pid_of(target) + "/maps").find("libiprobe-rt"), std::string::npos);

    auto a = iprobe({"attach", pid_of(target), "--functions", "counted", "--ring-records", kBigRing});
    ASSERT_EQ(a.exit_code, 0) << a.err;
    EXPECT_NE(a.out.find("enabled 2 probes"), std::string::npos) << a.out;  // entry + exit
    EXPECT_NE(a.out.find("runtime injected"), std::string::npos) << a.out;
    EXPECT_NE(file_text("/proc/" + pid_of(target) + "/maps").find("libiprobe-rt"), std::string::npos);

    EXPECT_EQ(target.command("burst " + std::to_string(kBurst)), kThreads * kBurst);
    auto r = iprobe({"report", pid_of(target), "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(json_calls(r.out, "counted"), kThreads * kBurst) << r.out;
    EXPECT_EQ(json_number(r.out, "trace_dropped"), 0) << r.out;
    EXPECT_EQ(json_calls(r.out, "work"), -1) << "work() was not selected";

    auto d = iprobe({"detach", pid_of(target)});
    ASSERT_EQ(d.exit_code, 0) << d.err;
    EXPECT_NE(d.out.find("disabled 2 probes"), std::string::npos) << d.out;
    EXPECT_EQ(text_of(target.pid(), "/hp_target"), text_before) << "code differs after detach";

    // after detach nothing is counted any more, and what was counted stays
    target.command("burst 1000");
    r = iprobe({"report", pid_of(target), "--json"});
    EXPECT_EQ(json_calls(r.out, "counted"), kThreads * kBurst) << r.out;
    EXPECT_TRUE(target.child().running());
    // Session and reader locks go with their sessions.
    EXPECT_NE(::access(("/run/iprobe/" + pid_of(target) + ".lock").c_str(), F_OK), 0);
    EXPECT_NE(::access(("/run/iprobe/" + pid_of(target) + ".reader.lock").c_str(), F_OK), 0);
}

TEST_F(HotpatchTest, Survives200AttachDetachCyclesUnderLoadThenCountsExactly) {
    HpTarget target(kThreads);
    const auto text_before = text_of(target.pid(), "/hp_target");
    const std::string pid = pid_of(target);
    auto first = iprobe({"attach", pid, "--functions", "work,leaf", "--ring-records", kBigRing});
    ASSERT_EQ(first.exit_code, 0) << first.err;
    ASSERT_EQ(iprobe({"detach", pid}).exit_code, 0);
    for (int cycle = 0; cycle < 200; cycle++) {
        const bool count = cycle % 3 == 1;
        auto a = iprobe({"attach", pid, "--functions", cycle % 2 ? "work" : "work,leaf,counted", "--handler",
                         count ? "count" : "trace"});
        ASSERT_EQ(a.exit_code, 0) << "cycle " << cycle << ": " << a.err;
        if (cycle % 20 == 0) {
            ASSERT_EQ(iprobe({"report", pid, "--json"}).exit_code, 0);
        }
        auto d = iprobe({"detach", pid});
        ASSERT_EQ(d.exit_code, 0) << "cycle " << cycle << ": " << d.err;
        ASSERT_TRUE(target.child().running()) << "target died in cycle " << cycle;
    }
    EXPECT_EQ(text_of(target.pid(), "/hp_target"), text_before);

    // exact phase: mark what the cycles left, then one known burst
    ASSERT_EQ(iprobe({"report", pid, "--reset"}).exit_code, 0);
    ASSERT_EQ(iprobe({"attach", pid, "--functions", "counted"}).exit_code, 0);
    EXPECT_EQ(target.command("burst " + std::to_string(kBurst)), kThreads * kBurst);
    auto r = iprobe({"report", pid, "--json", "--since-last"});
    EXPECT_EQ(json_calls(r.out, "counted"), kThreads * kBurst) << r.out;
    r = iprobe({"report", pid, "--json", "--since-last"});
    EXPECT_EQ(json_calls(r.out, "counted"), -1) << "nothing happened since the last --since-last: " << r.out;
    ASSERT_EQ(iprobe({"detach", pid}).exit_code, 0);
    EXPECT_EQ(text_of(target.pid(), "/hp_target"), text_before);
}

// A process that creates and ends threads at every moment (a JVM, a thread
// per request): each stop meets threads that exit between being listed and
// being seized, and clones of threads seized a moment before (the kernel
// attaches those to us itself).  Neither is "traced by another" nor "not
// permitted": every attach and detach goes through, and counts stay exact.
TEST_F(HotpatchTest, AttachesAndDetachesWhileThreadsAreCreatedAndExitAllTheTime) {
    HpTarget target(2);
    const auto text_before = text_of(target.pid(), "/hp_target");
    const std::string pid = pid_of(target);
    ASSERT_EQ(target.command("storm 12"), 12);
    for (int cycle = 0; cycle < 200; cycle++) {
        auto a = iprobe({"attach", pid, "--handler", cycle % 2 ? "count" : "trace"});
        ASSERT_EQ(a.exit_code, 0) << "cycle " << cycle << ": " << a.err;
        auto d = iprobe({"detach", pid});
        ASSERT_EQ(d.exit_code, 0) << "cycle " << cycle << ": " << d.err;
        ASSERT_TRUE(target.child().running()) << "target died in cycle " << cycle;
    }
    EXPECT_EQ(text_of(target.pid(), "/hp_target"), text_before);
    ASSERT_EQ(iprobe({"attach", pid, "--functions", "counted"}).exit_code, 0);
    EXPECT_EQ(target.command("burst " + std::to_string(kBurst)), 2 * kBurst);
    const auto r = iprobe({"report", pid, "--json"});
    EXPECT_EQ(json_calls(r.out, "counted"), 2 * kBurst) << r.out;
    ASSERT_EQ(iprobe({"detach", pid}).exit_code, 0);
    EXPECT_EQ(text_of(target.pid(), "/hp_target"), text_before);
}

// `attach --runtime` with a runtime of another name (the hooks build, a copy
// of a runtime kept to compare against): each later command finds it in the
// process by what it is, not by the installed file's name, and an attach
// after the first (its second stop, or a later attach) takes the region it
// made rather than asking for another.  A name no command could find it by
// is refused before anything is loaded.
TEST_F(HotpatchTest, ARuntimeGivenUnderAnotherNameIsFoundByEveryCommandAfterIt) {
    TempDir dir;
    const std::string copy = dir.path() + "/libiprobe-rt-kept.so", misnamed = dir.path() + "/kept-runtime.so";
    std::filesystem::copy_file(build_dir() + "/lib/libiprobe-rt.so", copy);
    std::filesystem::copy_file(build_dir() + "/lib/libiprobe-rt.so", misnamed);
    HpTarget target(2);
    const auto text_before = text_of(target.pid(), "/hp_target");
    const std::string pid = pid_of(target);

    auto r = iprobe({"attach", pid, "--functions", "counted", "--runtime", misnamed});
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find("must begin with libiprobe-rt"), std::string::npos) << r.err;
    r = iprobe({"status", pid, "--json"});
    EXPECT_NE(r.out.find("\"runtime_loaded\":false"), std::string::npos) << r.out;

    r = iprobe({"attach", pid, "--functions", "counted", "--runtime", copy, "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("\"planned_while_running\":true"), std::string::npos) << r.out;
    EXPECT_EQ(target.command("burst 1000"), 2000);
    r = iprobe({"status", pid, "--json"});
    EXPECT_NE(r.out.find("\"runtime\":\"" + copy + "\""), std::string::npos) << r.out;
    EXPECT_EQ(json_calls(iprobe({"report", pid, "--json"}).out, "counted"), 2000);
    // A later attach adds a probe to the same region.
    r = iprobe({"attach", pid, "--functions", "in_signal", "--runtime", copy});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(target.command("burst 1000"), 2000);
    EXPECT_EQ(json_calls(iprobe({"report", pid, "--json"}).out, "counted"), 4000);
    r = iprobe({"trace", pid, "--duration", "0.2"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    r = iprobe({"detach", pid});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(text_of(target.pid(), "/hp_target"), text_before);
}

// More threads making hooked calls at once than the runtime's return pool
// serves (IPROBE_RT_RETURN_POOL_THREADS), and than the region has thread
// slots (512): each call the pool could not hook, and each the sums could
// not hold, is counted and said as such, exactly, not as calls "deeper than
// a thread's return stack".
TEST_F(HotpatchTest, ThreadsBeyondTheReturnPoolAndTheSlotsAreCountedForWhatTheyAre) {
    constexpr long kHeld = IPROBE_RT_RETURN_POOL_THREADS + 76, kSlots = 512;
    HpTarget target(1);
    const std::string pid = pid_of(target);
    ASSERT_EQ(iprobe({"attach", pid, "--functions", "held"}).exit_code, 0);
    ASSERT_EQ(target.command("hold " + std::to_string(kHeld)), kHeld) << "threads ran out";
    auto r = iprobe({"report", pid, "--json"});
    EXPECT_EQ(json_calls(r.out, "held"), kSlots) << r.out;
    EXPECT_EQ(json_completed(r.out, "held"), kSlots) << r.out;
    EXPECT_EQ(json_number(r.out, "lost"), kHeld - kSlots) << r.out;
    EXPECT_EQ(json_number(r.out, "unhooked_returns"), kHeld - IPROBE_RT_RETURN_POOL_THREADS) << r.out;
    EXPECT_EQ(json_number(r.out, "unhooked_pool_empty"), kHeld - IPROBE_RT_RETURN_POOL_THREADS) << r.out;
    r = iprobe({"report", pid});
    EXPECT_NE(r.out.find("unhooked: 76 calls whose exit could not be hooked, not in `completed`: 76 in threads that "
                         "found the runtime's return pool held by other threads"),
              std::string::npos)
        << r.out;
    EXPECT_EQ(r.out.find("deeper"), std::string::npos) << r.out;
    EXPECT_EQ(target.command("release"), kHeld);
    ASSERT_EQ(iprobe({"detach", pid}).exit_code, 0);
}

// `attach --max-threads N`: a service with more threads than the default
// 512 slots has each thread's calls in the sums.  The region keeps the
// geometry its first attach gave it: a later attach asking for another is
// told so (and goes on).  One too large to map is refused before anything
// is changed in the target.
TEST_F(HotpatchTest, MaxThreadsGivesEachThreadItsSumsAndALaterAttachSaysTheRegionIsKept) {
    constexpr long kHeld = 700;
    HpTarget target(1);
    const std::string pid = pid_of(target);
    auto r = iprobe({"attach", pid, "--functions", "held", "--max-threads", "65536", "--buffer", "16G"});
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find("more than iprobe maps"), std::string::npos) << r.err;
    EXPECT_NE(iprobe({"status", pid, "--json"}).out.find("\"runtime_loaded\":false"), std::string::npos)
        << "refused before the runtime was loaded";

    r = iprobe({"attach", pid, "--functions", "held", "--max-threads", "1024", "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(json_number(r.out, "thread_slots"), 1024) << r.out;
    EXPECT_NE(r.out.find("\"geometry_kept\":false"), std::string::npos) << r.out;
    ASSERT_EQ(target.command("hold " + std::to_string(kHeld)), kHeld);
    r = iprobe({"report", pid, "--json"});
    EXPECT_EQ(json_calls(r.out, "held"), kHeld) << r.out;
    EXPECT_EQ(json_completed(r.out, "held"), kHeld) << r.out;
    EXPECT_EQ(json_number(r.out, "lost"), 0) << r.out;

    r = iprobe({"attach", pid, "--functions", "counted", "--max-threads", "64"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("made by an earlier attach, with rings of 16384 records and 1024 thread slots"),
              std::string::npos)
        << r.out;
    r = iprobe({"attach", pid, "--functions", "in_signal", "--json"});
    EXPECT_NE(r.out.find("\"geometry_kept\":false"), std::string::npos) << "nothing asked, nothing said: " << r.out;
    EXPECT_EQ(target.command("release"), kHeld);
    ASSERT_EQ(iprobe({"detach", pid}).exit_code, 0);
}

// Where a function's first instruction starts in `pid` (its probe list's
// site, moved by the module's load address).
std::uint64_t entry_site_in(pid_t pid, const std::string& binary, const std::string& function) {
    const auto list = iprobe({"list", binary, "--functions", function, "--json"});
    const long long site = json_number(list.out, "site");
    if (site < 0) return 0;
    std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
    std::string line;
    while (std::getline(maps, line))
        if (line.ends_with(binary) && line.find(" 00000000 ") != std::string::npos)
            return std::stoull(line.substr(0, line.find('-')), nullptr, 16) + static_cast<std::uint64_t>(site);
    return 0;
}

// A breakpoint on a function (a debugger's, or a uprobe's from bpftrace or
// perf probe: an int3 over its first byte) is said as that, with what to
// do, and the code is left as it was; once it is gone the attach goes on.
TEST_F(HotpatchTest, ABreakpointOnAFunctionIsSaidAsOneAndItsCodeLeftAlone) {
    HpTarget target(1);
    const std::string pid = pid_of(target);
    const std::string binary = targets_dir() + "/hp_target";
    const std::uint64_t site = entry_site_in(target.pid(), binary, "counted");
    ASSERT_NE(site, 0u);
    const int mem = ::open(("/proc/" + pid + "/mem").c_str(), O_RDWR);
    ASSERT_GE(mem, 0);
    std::uint8_t first = 0;
    const std::uint8_t int3 = 0xcc;
    ASSERT_EQ(::pread(mem, &first, 1, static_cast<off_t>(site)), 1);
    ASSERT_EQ(::pwrite(mem, &int3, 1, static_cast<off_t>(site)), 1);  // as gdb's `break counted`
    const auto text_before = text_of(target.pid(), "/hp_target");

    auto r = iprobe({"attach", pid, "--functions", "counted"});
    EXPECT_EQ(r.exit_code, 6) << r.err;
    EXPECT_NE(r.err.find("in counted holds [cc"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("a breakpoint (int3) is on it"), std::string::npos) << r.err;
    EXPECT_EQ(text_of(target.pid(), "/hp_target"), text_before) << "the code is as the breakpoint left it";

    ASSERT_EQ(::pwrite(mem, &first, 1, static_cast<off_t>(site)), 1);  // the breakpoint removed
    ::close(mem);
    ASSERT_EQ(iprobe({"attach", pid, "--functions", "counted"}).exit_code, 0);
    EXPECT_EQ(target.command("burst 1000"), 1000);
    EXPECT_EQ(json_calls(iprobe({"report", pid, "--json"}).out, "counted"), 1000);
    ASSERT_EQ(iprobe({"detach", pid}).exit_code, 0);
}

// Entries and exits of `function` in a file written by `iprobe trace --output`.
std::pair<long long, long long> events_in_file(const std::string& path, const std::string& function) {
    hotpatch::TraceFileReader file(path);
    long long entries = 0, exits = 0;
    while (file.next([&](const hotpatch::Event& e) {
        if (e.probe >= file.probes().size() || file.probes()[e.probe].function != function) return;
        (e.kind == probelist::ProbeKind::entry ? entries : exits)++;
    })) {
    }
    return {entries, exits};
}

// Millions of events from 4 threads through rings of 1024 records: the
// default trace drops what the writer cannot keep up with, every one
// counted (written + dropped = 2 x calls); --lossless makes the threads
// wait for it instead, and the file holds every event.
TEST_F(HotpatchTest, LosslessTraceWritesEveryEventOfEveryThread) {
    constexpr int kWorkers = 4;
    constexpr long kCalls = 500000;  // per thread and burst
    HpTarget target(kWorkers, targets_dir() + "/hp_target_entry");
    const std::string pid = pid_of(target);
    ASSERT_EQ(iprobe({"attach", pid, "--functions", "counted", "--ring-records", "1024"}).exit_code, 0);
    TempDir dir;
    long long dropped_before = 0;
    for (const bool lossless : {false, true}) {
        SCOPED_TRACE(lossless ? "lossless" : "lossy");
        const std::string file = dir / (lossless ? "lossless.trace" : "lossy.trace");
        std::vector<std::string> argv{iprobe_bin(), "trace", pid, "--output", file};
        if (lossless) argv.push_back("--lossless");
        Child trace(argv, dir / "trace.out");
        std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the reader is draining
        EXPECT_EQ(target.command("burst " + std::to_string(kCalls), std::chrono::seconds(300)), kWorkers * kCalls);
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        trace.kill(SIGINT);
        ASSERT_EQ(trace.wait(std::chrono::seconds(60)), 0);
        const auto [entries, exits] = events_in_file(file, "counted");
        const long long dropped = json_number(iprobe({"report", pid, "--json"}).out, "trace_dropped");
        if (lossless) {
            EXPECT_EQ(dropped, dropped_before) << "nothing dropped while lossless";
            EXPECT_EQ(entries, kWorkers * kCalls);
            EXPECT_EQ(exits, kWorkers * kCalls);
            // each worker's own: every entry and exit
            std::map<std::uint32_t, std::pair<long long, long long>> per_thread;
            hotpatch::TraceFileReader reread(file);
            while (reread.next([&](const hotpatch::Event& e) {
                if (e.probe >= reread.probes().size() || reread.probes()[e.probe].function != "counted") return;
                auto& [in, out] = per_thread[e.tid];
                (e.kind == probelist::ProbeKind::entry ? in : out)++;
            })) {
            }
            ASSERT_EQ(per_thread.size(), static_cast<std::size_t>(kWorkers));
            for (const auto& [tid, counts] : per_thread) {
                EXPECT_EQ(counts.first, kCalls) << "entries of thread " << tid;
                EXPECT_EQ(counts.second, kCalls) << "exits of thread " << tid;
            }

        } else {
            EXPECT_EQ(entries + exits + dropped, 2 * kWorkers * kCalls) << "every event written or counted dropped";
            dropped_before = dropped;
        }
    }
    // A lossless reader killed outright never gets to turn lossless off: the
    // threads wait for it at most IPROBE_RT_LOSSLESS_WAIT_S, then the runtime
    // turns it off itself and they go on dropping, counted.
    Child killed({iprobe_bin(), "trace", pid, "--output", dir / "killed.trace", "--lossless"}, dir / "trace.out");
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    killed.kill(SIGKILL);
    killed.wait();
    EXPECT_EQ(target.command("burst " + std::to_string(kCalls), std::chrono::seconds(60)), kWorkers * kCalls);
    const long long dropped = json_number(iprobe({"report", pid, "--json"}).out, "trace_dropped");
    EXPECT_GT(dropped, dropped_before) << "the events nobody read are counted";
}

// A ring nobody reads: each thread's first 1024 events fit, every later one
// is dropped and counted, and the sums still see every call (the trace
// handler's fast path gives each place back through the C that decides).
// Read then, each thread's next event says how many were dropped just
// before it, live and in a file alike.
TEST_F(HotpatchTest, ARingNobodyReadsCountsEveryEventItDrops) {
    constexpr int kWorkers = 2;
    constexpr long kCalls = 100000;
    constexpr long kRing = 1024;
    HpTarget target(kWorkers, targets_dir() + "/hp_target_entry");
    const std::string pid = pid_of(target);
    ASSERT_EQ(iprobe({"attach", pid, "--functions", "counted", "--ring-records", std::to_string(kRing)}).exit_code, 0);
    EXPECT_EQ(target.command("burst " + std::to_string(kCalls)), kWorkers * kCalls);
    const std::string json = iprobe({"report", pid, "--json"}).out;
    EXPECT_EQ(json_calls(json, "counted"), kWorkers * kCalls) << json;
    EXPECT_EQ(json_completed(json, "counted"), kWorkers * kCalls) << json;
    EXPECT_EQ(json_number(json, "timed"), kWorkers * kCalls) << json;
    EXPECT_EQ(json_number(json, "trace_dropped"), 2 * kWorkers * kCalls - kWorkers * kRing) << json;

    auto kept = iprobe({"trace", pid, "--duration", "0", "--format", "json"});
    EXPECT_EQ(lines_with(kept.out, {"\"function\":\"counted\""}).size(), static_cast<std::size_t>(kWorkers * kRing));
    EXPECT_EQ(lines_with(kept.out, {"dropped_before"}).size(), 0u) << "the first 1024 came before the gap";
    const std::string dropped = "\"dropped_before\":" + std::to_string(2 * kCalls - kRing) + "}";
    EXPECT_EQ(target.command("burst 10"), kWorkers * 10);
    auto live = iprobe({"trace", pid, "--duration", "0", "--format", "json"});
    EXPECT_EQ(lines_with(live.out, {"\"kind\":\"entry\",\"function\":\"counted\",\"depth\":0," + dropped}).size(),
              static_cast<std::size_t>(kWorkers))
        << "each thread's first event after the gap says it, once\n" << live.out;
    EXPECT_EQ(lines_with(live.out, {"dropped_before"}).size(), static_cast<std::size_t>(kWorkers)) << live.out;
    EXPECT_EQ(target.command("burst " + std::to_string(kCalls)), kWorkers * kCalls);  // full again: 2 * kCalls - kRing dropped
    TempDir dir;
    const std::string file = dir / "gaps.trace";
    ASSERT_EQ(iprobe({"trace", pid, "--duration", "0", "--output", file}).exit_code, 0);  // the ring's kRing
    EXPECT_EQ(target.command("burst 10"), kWorkers * 10);
    const std::string more = dir / "after.trace";
    auto written = iprobe({"trace", pid, "--duration", "0", "--output", more, "--format", "json"});
    ASSERT_EQ(written.exit_code, 0) << written.err;
    auto converted = iprobe({"trace", "--input", more, "--format", "json"});
    EXPECT_EQ(converted.out, written.out);
    EXPECT_EQ(lines_with(converted.out, {dropped}).size(), static_cast<std::size_t>(kWorkers)) << converted.out;
    auto text = iprobe({"trace", "--input", more});
    EXPECT_EQ(lines_with(text.out, {"-- " + std::to_string(2 * kCalls - kRing) + " events dropped here (ring full) --"}).size(),
              static_cast<std::size_t>(kWorkers))
        << text.out;
}

// A prefork server's workers (nginx's, forked by a probed master) run
// their parent's patched code with no region of their own: `status` said
// an attach had been interrupted, `detach` that there was nothing to
// detach, and `attach` that the functions were enabled with another
// handler, so a worker could be neither cleaned nor probed.  The runtime
// keeps its parent's module table at the fork: status says what the
// child inherited, detach puts it back, attach puts it back and probes
// the child as itself.
TEST_F(HotpatchTest, AForkedChildsInheritedProbesAreShownDetachedOrReplaced) {
    HpTarget target(1, targets_dir() + "/hp_target_entry");
    const auto text_before = text_of(target.pid(), "/hp_target_entry");
    auto r = iprobe({"attach", pid_of(target), "--functions", "counted", "--handler", "count"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto wait_for_calls = [](const std::string& pid, long long calls) {
        std::string out;
        for (int i = 0; i < 200; i++) {
            out = iprobe({"report", pid, "--json"}).out;
            if (json_calls(out, "counted") == calls) break;
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        return out;
    };

    // The target's children, killed with the test (the target reaps them).
    struct Spawned {
        pid_t pid_;
        pid_t pid() const { return pid_; }
        ~Spawned() { ::kill(pid_, SIGKILL); }
    };

    // status, then detach
    const Spawned first{static_cast<pid_t>(target.command("spawn 10"))};
    const std::string child = std::to_string(first.pid());
    for (int i = 0; i < 200 && json_number(iprobe({"status", child, "--json"}).out, "fork_child_events") < 10; i++)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    r = iprobe({"status", child, "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(json_number(r.out, "forked_from"), target.pid()) << r.out;
    EXPECT_EQ(json_number(r.out, "inherited_live"), 1) << "counted's entry site: " << r.out;
    EXPECT_EQ(json_number(r.out, "fork_child_events"), 10) << r.out;
    r = iprobe({"status", child});
    EXPECT_NE(r.out.find("forked from probed process " + pid_of(target) + ", it still runs 1 of its parent's probes"),
              std::string::npos)
        << r.out;
    r = iprobe({"detach", child});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("disabled 1 probes in process " + child + " (0 still on): 1 sites restored"), std::string::npos)
        << r.out;
    EXPECT_EQ(text_of(first.pid(), "/hp_target_entry"), text_before) << "the child's code is the file's again";
    r = iprobe({"status", child, "--json"});
    EXPECT_EQ(json_number(r.out, "inherited_live"), 0) << "nothing inherited any more: " << r.out;
    EXPECT_EQ(json_number(r.out, "forked_from"), target.pid()) << r.out;
    EXPECT_NE(text_of(target.pid(), "/hp_target_entry"), text_before) << "the parent keeps its probes";

    // attach: the inherited site goes back, the child's own probes go on
    const Spawned second{static_cast<pid_t>(target.command("spawn 10"))};
    const std::string other = std::to_string(second.pid());
    r = iprobe({"attach", other, "--functions", "counted", "--handler", "count", "--completed", "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(json_number(r.out, "inherited_sites_restored"), 1) << r.out;
    EXPECT_EQ(json_number(r.out, "enabled"), 2) << r.out;
    ::kill(second.pid(), SIGUSR1);
    r.out = wait_for_calls(other, 10);
    EXPECT_EQ(json_calls(r.out, "counted"), 10) << "its own calls, counted in its own region: " << r.out;
    EXPECT_EQ(json_completed(r.out, "counted"), 10) << r.out;
    r = iprobe({"detach", other});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(text_of(second.pid(), "/hp_target_entry"), text_before);
    EXPECT_EQ(target.command("burst 5"), 5) << "the parent goes on";
    EXPECT_EQ(json_calls(iprobe({"report", pid_of(target), "--json"}).out, "counted"), 5);
}

// A service confined by seccomp (systemd's SystemCallFilter=,
// MemoryDenyWriteExecute=, a sandbox): the attach's calls in it (the
// runtime's loading, its region, stub areas, the handlers' own) are checked
// against its filters before any is made.  One its filter kills on was
// made, and killed the service; one it fails left it half-attached, with a
// message about a bad descriptor (the runtime's -errno read as a 64-bit fd).
TEST_F(HotpatchTest, ASeccompFilterThatForbidsAnAttachsCallsRefusesItAndChangesNothing) {
    const std::string program = targets_dir() + "/seccomp_target";
    TempDir dir;
    auto confined = [&](const std::string& mode) {
        const std::string out = dir / (mode + ".out");
        Child c({program, mode}, out);
        for (int i = 0; i < 500 && file_text(out).find("tick") == std::string::npos; i++)
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        EXPECT_NE(file_text(out).find("tick 0"), std::string::npos) << mode << " did not start";
        return c;
    };
    for (const auto& [mode, said] :
         {std::pair<std::string, std::string>{"kill-memfd", "its seccomp filter would kill the process on memfd_create"},
          {"errno-memfd", "its seccomp filter would fail with Operation not permitted on memfd_create"}}) {
        SCOPED_TRACE(mode);
        Child c = confined(mode);
        const std::string pid = std::to_string(c.pid());
        const auto text = text_of(c.pid(), "/seccomp_target");
        ASSERT_FALSE(text.empty());
        const auto r = iprobe({"attach", pid, "--handler", "count"});
        EXPECT_EQ(r.exit_code, 7) << r.err;
        EXPECT_NE(r.err.find("process " + pid + " cannot be attached: " + said), std::string::npos) << r.err;
        EXPECT_NE(r.err.find("nothing was changed"), std::string::npos) << r.err;
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        EXPECT_TRUE(c.running());
        EXPECT_EQ(file_text("/proc/" + pid + "/maps").find("libiprobe-rt"), std::string::npos) << "no runtime loaded";
        EXPECT_EQ(text_of(c.pid(), "/seccomp_target"), text);
    }
    // Filters that allow what an attach does, one deciding on arguments.
    for (const std::string mode : {"allow-list", "mdwe"}) {
        SCOPED_TRACE(mode);
        Child c = confined(mode);
        const std::string pid = std::to_string(c.pid());
        auto r = iprobe({"attach", pid, "--handler", "trace", "--functions", "tick", "--args", "--retval"});
        ASSERT_EQ(r.exit_code, 0) << r.err;
        long long calls = 0;
        for (int i = 0; i < 300 && calls < 100; i++) {
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
            calls = json_calls(iprobe({"report", pid, "--json"}).out, "tick");
        }
        EXPECT_GE(calls, 100) << "tick is traced";
        r = iprobe({"detach", pid});
        EXPECT_EQ(r.exit_code, 0) << r.err;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        EXPECT_TRUE(c.running()) << "every call the attach made was allowed";
    }
}

TEST_F(HotpatchTest, CountHandlerCountsExactly) {
    HpTarget target(kThreads);
    const std::string pid = pid_of(target);
    ASSERT_EQ(iprobe({"attach", pid, "--functions", "counted", "--entry-only", "--handler", "count"}).exit_code, 0);
    EXPECT_EQ(target.command("burst 50000"), kThreads * 50000);
    auto r = iprobe({"report", pid, "--json"});
    EXPECT_EQ(json_calls(r.out, "counted"), kThreads * 50000) << r.out;
}

TEST_F(HotpatchTest, ProbesInASharedLibraryAndTraceFormats) {
    HpTarget target(2);
    const std::string pid = pid_of(target);
    auto a = iprobe({"attach", pid, "--probes", targets_dir() + "/libhp_lib.so", "--ring-records", kBigRing});
    ASSERT_EQ(a.exit_code, 0) << a.err;
    EXPECT_NE(a.out.find("enabled 2 probes"), std::string::npos) << a.out;
    EXPECT_EQ(target.command("burst 1000"), 2000);
    auto t = iprobe({"trace", pid, "--format", "json", "--duration", "0"});
    ASSERT_EQ(t.exit_code, 0) << t.err;
    std::size_t entries = 0, exits = 0;
    for (std::size_t at = 0; (at = t.out.find("\"kind\":\"entry\",\"function\":\"lib_counted\"", at)) != std::string::npos; at++) entries++;
    for (std::size_t at = 0; (at = t.out.find("\"kind\":\"exit\",\"function\":\"lib_counted\"", at)) != std::string::npos; at++) exits++;
    EXPECT_EQ(entries, 2000u);
    EXPECT_EQ(exits, 2000u);

    target.command("burst 10");
    auto c = iprobe({"trace", pid, "--format", "chrome", "--duration", "0"});
    ASSERT_EQ(c.exit_code, 0);
    EXPECT_EQ(c.out.rfind("{\"traceEvents\":[", 0), 0u) << c.out.substr(0, 200);
    EXPECT_NE(c.out.find("\"ph\":\"B\""), std::string::npos);
    EXPECT_NE(c.out.find("]}"), std::string::npos);

    target.command("burst 10");
    auto x = iprobe({"trace", pid, "--duration", "0"});
    EXPECT_NE(x.out.find("-> lib_counted"), std::string::npos) << x.out.substr(0, 300);
    EXPECT_NE(x.out.find("<- lib_counted"), std::string::npos);

    // the main executable added to the same region
    ASSERT_EQ(iprobe({"attach", pid, "--functions", "counted"}).exit_code, 0);
    target.command("burst 10");
    auto r = iprobe({"report", pid, "--json"});
    EXPECT_EQ(json_calls(r.out, "counted"), 20) << r.out;
    EXPECT_EQ(json_calls(r.out, "lib_counted"), 2000 + 3 * 20) << "every call since the attach: " << r.out;
    auto folded = iprobe({"report", pid, "--folded"});
    EXPECT_EQ(folded.exit_code, 0);
    ASSERT_EQ(iprobe({"detach", pid}).exit_code, 0);
}

// An entry-only function (leaf, --entry-only) called inside a traced one
// (work, entry and exit): each of its entries sits inside the call of work
// open around it and opens no call of its own (an exit never comes), in the
// live stream and in a file converted to every format alike.  Lossless
// from before work is on, so no exit is dropped under an open call.
TEST_F(HotpatchTest, AnEntryWithoutItsExitSitsInsideTheCallAroundIt) {
    HpTarget target(1);
    const std::string pid = pid_of(target);
    TempDir dir;
    // leaf on, a lossless `trace ARGS` running, then work on: what it wrote
    auto trace_while_work_is_on = [&](std::vector<std::string> args, const std::string& out) {
        EXPECT_EQ(iprobe({"attach", pid, "--functions", "leaf", "--entry-only"}).exit_code, 0);
        args.insert(args.begin(), {iprobe_bin(), "trace", pid, "--lossless"});
        Child trace(args, dir / out);
        std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the writer is draining
        EXPECT_EQ(iprobe({"attach", pid, "--functions", "work"}).exit_code, 0);
        // until the stream it prints has reached work's calls (lossless, the
        // target waits for a writer still behind on leaf's)
        const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
        for (std::string tail; tail.find("\"kind\":\"exit\",\"function\":\"work\"") == std::string::npos &&
                               std::chrono::steady_clock::now() < give_up;) {
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
            std::ifstream in(dir / out, std::ios::ate);
            const auto size = static_cast<std::streamoff>(in.tellg());
            tail.assign(1 << 16, '\0');
            in.seekg(std::max<std::streamoff>(0, size - static_cast<std::streamoff>(tail.size())));
            in.read(tail.data(), static_cast<std::streamsize>(tail.size()));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        trace.kill(SIGINT);
        EXPECT_EQ(trace.wait(std::chrono::seconds(60)), 0);
        EXPECT_EQ(iprobe({"detach", pid}).exit_code, 0);
        // what the rings kept after the writer stopped (a call of work whose
        // exit the detach lost among it) is not the next writer's
        EXPECT_EQ(iprobe({"trace", pid, "--duration", "0", "--format", "json"}).exit_code, 0);
        return file_text(dir / out);
    };
    // The JSON lines from the first entry of work on (before it, leaf alone).
    auto check_json = [](const std::string& stream, const std::string& what) {
        long leaves = 0, works = 0, work_exits = 0, misplaced = 0;
        std::string first_misplaced;
        bool in_work = false;
        std::istringstream lines(stream);
        for (std::string line; std::getline(lines, line);) {
            if (line.empty() || line[0] != '{') continue;  // the writer's own words on stderr
            const bool leaf = line.find("\"function\":\"leaf\"") != std::string::npos;
            const bool entry = line.find("\"kind\":\"entry\"") != std::string::npos;
            if (!in_work && !(entry && !leaf)) continue;
            in_work = true;
            const bool placed = leaf ? entry && line.find("\"depth\":1,\"exit_traced\":false}") != std::string::npos
                                     : line.find("\"depth\":0}") != std::string::npos;
            if (!placed && misplaced++ == 0) first_misplaced = line;
            (leaf ? leaves : entry ? works : work_exits)++;
        }
        EXPECT_EQ(misplaced, 0) << what << ", the first: " << first_misplaced;
        EXPECT_GT(works, 100) << what;  // a stream, not its length, is the point
        // one leaf a call of work (the stream may end between the two)
        EXPECT_LE(leaves, works) << what;
        EXPECT_GE(leaves, works - 1) << what;
        EXPECT_GE(work_exits, works - 1) << what << ": only the last call of work may still be open";
    };
    check_json(trace_while_work_is_on({"--format", "json"}, "live.json"), "live");

    const std::string file = dir / "trace.iprobe";
    trace_while_work_is_on({"--output", file, "--format", "json"}, "writer.out");
    auto json = iprobe({"trace", "--input", file, "--format", "json"});
    ASSERT_EQ(json.exit_code, 0) << json.err;
    check_json(json.out, "file");
    auto chrome = iprobe({"trace", "--input", file, "--format", "chrome"});
    EXPECT_EQ(chrome.out.find("{\"name\":\"leaf\",\"ph\":\"B\""), std::string::npos) << "a leaf span never ended";
    EXPECT_NE(chrome.out.find("{\"name\":\"leaf\",\"ph\":\"i\""), std::string::npos) << chrome.out.substr(0, 300);
    EXPECT_NE(chrome.out.find("{\"name\":\"work\",\"ph\":\"B\""), std::string::npos);
    auto text = iprobe({"trace", "--input", file});
    // "TID   -> leaf" (indented once: inside work), never deeper
    EXPECT_NE(text.out.find("   -> leaf\n"), std::string::npos) << "inside work: " << text.out.substr(0, 300);
    EXPECT_EQ(text.out.find("     -> "), std::string::npos) << "nothing nests inside leaf";
    EXPECT_EQ(text.out.find("<- leaf"), std::string::npos);
}

TEST_F(HotpatchTest, TraceToABinaryFileConvertsToEveryFormat) {
    HpTarget target(2);
    const std::string pid = pid_of(target);
    ASSERT_EQ(iprobe({"attach", pid, "--functions", "counted", "--ring-records", kBigRing}).exit_code, 0);
    EXPECT_EQ(target.command("burst 1000"), 2000);
    TempDir dir;
    const std::string file = dir / "trace.iprobe";
    auto w = iprobe({"trace", pid, "--duration", "0", "--output", file});
    ASSERT_EQ(w.exit_code, 0) << w.err;
    EXPECT_NE(w.err.find("4000 events written"), std::string::npos) << w.err;
    // 8 bytes an event after a 40-byte header and a 16-byte block head per
    // thread (one drain: one block each); the probe table starts there
    std::ifstream in(file, std::ios::binary);
    std::uint64_t table_at = 0;
    in.seekg(-16, std::ios::end);
    in.read(reinterpret_cast<char*>(&table_at), 8);
    EXPECT_EQ(table_at, 40u + 2u * 16u + 4000u * 8u);
    EXPECT_NE(w.err.find(" bytes/event)"), std::string::npos) << w.err;
    auto json = iprobe({"trace", "--input", file, "--format", "json"});
    ASSERT_EQ(json.exit_code, 0) << json.err;
    std::size_t entries = 0, exits = 0;
    for (std::size_t at = 0; (at = json.out.find("\"kind\":\"entry\",\"function\":\"counted\"", at)) != std::string::npos; at++) entries++;
    for (std::size_t at = 0; (at = json.out.find("\"kind\":\"exit\",\"function\":\"counted\"", at)) != std::string::npos; at++) exits++;
    EXPECT_EQ(entries, 2000u);
    EXPECT_EQ(exits, 2000u);
    auto chrome = iprobe({"trace", "--input", file, "--format", "chrome"});
    EXPECT_EQ(chrome.out.rfind("{\"traceEvents\":[", 0), 0u) << chrome.out.substr(0, 200);
    EXPECT_NE(chrome.out.find("\"pid\":" + pid), std::string::npos);
    auto text = iprobe({"trace", "--input", file});
    EXPECT_NE(text.out.find("-> counted"), std::string::npos) << text.out.substr(0, 300);
    // a file cut short is refused, not half-read
    fs::resize_file(file, fs::file_size(file) - 3);
    auto cut = iprobe({"trace", "--input", file});
    EXPECT_EQ(cut.exit_code, 3) << cut.err;
    EXPECT_NE(cut.err.find("ends early"), std::string::npos) << cut.err;
}

TEST_F(HotpatchTest, LlvmPassNopSitesAndPointArguments) {
    const std::string binary = targets_dir() + "/hp_target_llvm";
    if (::access(binary.c_str(), X_OK) != 0) GTEST_SKIP() << "the LLVM pass (llvm-14-dev) is not built";
    HpTarget target(kThreads, binary);
    const std::string pid = pid_of(target);
    const auto text_before = text_of(target.pid(), "/hp_target_llvm");
    auto a = iprobe({"attach", pid, "--functions", "burst_started", "--ring-records", kBigRing});
    ASSERT_EQ(a.exit_code, 0) << a.err;
    EXPECT_EQ(target.command("burst 10"), kThreads * 10);
    auto t = iprobe({"trace", pid, "--format", "json", "--duration", "0"});
    EXPECT_NE(t.out.find("\"kind\":\"point\",\"function\":\"burst_started\""), std::string::npos) << t.out;
    EXPECT_NE(t.out.find("\"args\":[10,8,42,43]"), std::string::npos) << t.out;

    // NOP-form entry/exit: trampolines must preserve every register
    ASSERT_EQ(iprobe({"attach", pid, "--functions", "counted,leaf,work"}).exit_code, 0);
    ASSERT_EQ(iprobe({"detach", pid, "--functions", "leaf,work"}).exit_code, 0);
    EXPECT_EQ(target.command("burst " + std::to_string(kBurst)), kThreads * kBurst);
    auto r = iprobe({"report", pid, "--json"});
    EXPECT_EQ(json_calls(r.out, "counted"), kThreads * kBurst) << r.out;
    EXPECT_NE(r.out.find("\"name\":\"counted\",\"calls\":800000,\"completed\":800000,\"timed\":800000"),
              std::string::npos)
        << "NOP-form entry and exit pair up: " << r.out;
    EXPECT_EQ(json_number(r.out, "lost"), 0) << r.out;
    ASSERT_EQ(iprobe({"detach", pid}).exit_code, 0);
    EXPECT_EQ(text_of(target.pid(), "/hp_target_llvm"), text_before);
    EXPECT_TRUE(target.child().running());
}

// ---- refusals: clear message, exit code, target untouched ----

TEST_F(HotpatchTest, RefusesNoSuchProcess) {
    auto r = iprobe({"attach", "999999"});
    EXPECT_EQ(r.exit_code, 5) << r.err;
    EXPECT_NE(r.err.find("no such process"), std::string::npos) << r.err;
}

TEST_F(HotpatchTest, RefusesWithoutPermission) {
    HpTarget target(1);
    const ToolsForAnotherUser tools;
    auto r = run(ToolsForAnotherUser::as_nobody(
        {tools.iprobe(), "attach", pid_of(target), "--probes", tools.reachable(targets_dir() + "/hp_target.probes")}));
    EXPECT_EQ(r.exit_code, 4) << r.out << r.err;
    EXPECT_NE(r.err.find("not permitted"), std::string::npos) << r.err;
}

// A program nobody prepared is probed through its symbols (tests/relocate);
// stripped of them as well, it has no probes at all.
TEST_F(HotpatchTest, RefusesAProgramWithNeitherProbesNorSymbols) {
    TempDir dir;
    const std::string stripped = dir / "hp_target_plain";
    ASSERT_EQ(run({"strip", "--strip-all", targets_dir() + "/hp_target_plain", "-o", stripped}).exit_code, 0);
    HpTarget target(1, stripped);
    const auto before = text_of(target.pid(), "/hp_target_plain");
    auto r = iprobe({"attach", pid_of(target)});
    EXPECT_EQ(r.exit_code, 3) << r.err;
    EXPECT_NE(r.err.find("no probes"), std::string::npos) << r.err;
    // the file as the user knows it (not /proc/PID/root/...), and what else there is
    EXPECT_NE(r.err.find("executable " + stripped + " has no probes"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("/proc/" + pid_of(target) + "/root"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("--module NAME"), std::string::npos) << r.err;
    EXPECT_EQ(text_of(target.pid(), "/hp_target_plain"), before);
}

TEST_F(HotpatchTest, RefusesAProbeListOfAnotherBuild) {
    HpTarget target(1);
    const auto before = text_of(target.pid(), "/hp_target");
    auto r = iprobe({"attach", pid_of(target), "--probes", targets_dir() + "/hp_target_other.probes"});
    EXPECT_EQ(r.exit_code, 3) << r.err;
    EXPECT_NE(r.err.find("build-id"), std::string::npos) << r.err;
    EXPECT_EQ(text_of(target.pid(), "/hp_target"), before);
}

TEST_F(HotpatchTest, RefusesAGlobMatchingNothing) {
    HpTarget target(1);
    auto r = iprobe({"attach", pid_of(target), "--functions", "no_such_function*"});
    EXPECT_EQ(r.exit_code, 5) << r.err;
    EXPECT_NE(r.err.find("no probe matches"), std::string::npos) << r.err;
    EXPECT_EQ(file_text("/proc/" + pid_of(target) + "/maps").find("libiprobe-rt"), std::string::npos)
        << "nothing may be injected for a refused attach";
}

// --no-durations records exits without a time: refused, before anything is
// injected, where an exit needs its time or a timed frame (values, --when,
// the count handler, an exit at a call site of its own).
TEST_F(HotpatchTest, RefusesNoDurationsWhereAnExitNeedsItsTimeAndChangesNothing) {
    HpTarget instrumented(1, targets_dir() + "/values_finstrument");  // exits at sites of their own
    HpTarget entry(1, targets_dir() + "/hp_target_entry");
    const std::vector<std::pair<std::vector<std::string>, std::string>> refused{
        {{"attach", pid_of(instrumented), "--no-durations"}, "is a call site of its own"},
        {{"attach", pid_of(entry), "--no-durations", "--handler", "count"}, "is for --handler trace"},
        {{"attach", pid_of(entry), "--no-durations", "--args"}, "drop one or the other"},
        {{"attach", pid_of(entry), "--no-durations", "--when", "arg0 > 1"}, "drop one or the other"}};
    for (const auto& [args, says] : refused) {
        auto r = iprobe(args);
        EXPECT_EQ(r.exit_code, 2) << r.err;
        EXPECT_NE(r.err.find(says), std::string::npos) << r.err;
    }
    for (HpTarget* t : {&instrumented, &entry})
        EXPECT_EQ(file_text("/proc/" + pid_of(*t) + "/maps").find("libiprobe-rt"), std::string::npos)
            << "nothing may be injected for a refused attach";
}

TEST_F(HotpatchTest, RefusesWhileAnotherSessionHoldsTheTarget) {
    HpTarget target(2);
    ::mkdir("/run/iprobe", 0700);
    const int fd = ::open(("/run/iprobe/" + pid_of(target) + ".lock").c_str(), O_RDWR | O_CREAT, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::flock(fd, LOCK_EX), 0);
    auto r = iprobe({"attach", pid_of(target)});
    EXPECT_EQ(r.exit_code, 6) << r.err;
    EXPECT_NE(r.err.find("another iprobe session"), std::string::npos) << r.err;
    ::close(fd);
    // a debugger (any other tracer) holding it
    ASSERT_EQ(::ptrace(PTRACE_SEIZE, target.pid(), nullptr, nullptr), 0);
    r = iprobe({"attach", pid_of(target)});
    EXPECT_EQ(r.exit_code, 6) << r.err;
    EXPECT_NE(r.err.find("already traced"), std::string::npos) << r.err;
    ::ptrace(PTRACE_INTERRUPT, target.pid(), nullptr, nullptr);
    int status = 0;
    ::waitpid(target.pid(), &status, __WALL);
    ASSERT_EQ(::ptrace(PTRACE_DETACH, target.pid(), nullptr, nullptr), 0);
    EXPECT_EQ(iprobe({"attach", pid_of(target)}).exit_code, 0);
}

TEST_F(HotpatchTest, ConcurrentAttachesNeverCorrupt) {
    HpTarget target(4);
    const std::string pid = pid_of(target);
    const auto before = text_of(target.pid(), "/hp_target");
    for (int round = 0; round < 10; round++) {
        CommandResult a, b;
        std::thread ta([&] { a = iprobe({"attach", pid, "--functions", "work"}); });
        std::thread tb([&] { b = iprobe({"attach", pid, "--functions", "leaf"}); });
        ta.join();
        tb.join();
        for (auto* r : {&a, &b}) EXPECT_TRUE(r->exit_code == 0 || r->exit_code == 6) << r->err;
        if (a.exit_code == 6) {
            EXPECT_NE(a.err.find("another iprobe session"), std::string::npos);
        }
        ASSERT_EQ(iprobe({"detach", pid}).exit_code, 0);
        ASSERT_TRUE(target.child().running());
    }
    EXPECT_EQ(text_of(target.pid(), "/hp_target"), before);
}

// Processes other than `target` that hold target's iprobe region open.
std::vector<pid_t> region_holders(pid_t target) {
    const std::string memfd = "/memfd:" IPROBE_RT_MEMFD_PREFIX + std::to_string(target) + " ";
    std::vector<pid_t> out;
    std::error_code ec;
    for (const auto& proc : fs::directory_iterator("/proc", ec)) {
        const std::string name = proc.path().filename();
        if (name.find_first_not_of("0123456789") != std::string::npos || std::stoi(name) == target) continue;
        std::error_code fd_ec;
        for (const auto& fd : fs::directory_iterator(proc.path() / "fd", fd_ec)) {
            std::error_code link_ec;
            if ((fs::read_symlink(fd.path(), link_ec).string() + " ").rfind(memfd, 0) == 0) {
                out.push_back(std::stoi(name));
                break;
            }
        }
    }
    return out;
}

bool leftovers_of(pid_t pid, std::string& found) {
    std::error_code ec;
    for (const char* dir : {"/dev/shm", "/run/iprobe"})
        for (const auto& f : fs::directory_iterator(dir, ec)) {
            const std::string name = f.path().filename();
            if (name.find(std::to_string(pid)) != std::string::npos)
                found += f.path().string() + " ";
        }
    return !found.empty();
}

// The "done when": 8 threads, 64,000,000 calls while attached with
// the default handler and default ring (far too small to hold the events):
// report is exact, twice, and after detach.
TEST_F(HotpatchTest, ReportIsExactAt64MillionCallsTwiceAndAfterDetach) {
    HpTarget target(kThreads);
    const std::string pid = pid_of(target);
    ASSERT_EQ(iprobe({"attach", pid, "--functions", "counted"}).exit_code, 0);
    constexpr long kPerThread = 8000000;
    ASSERT_EQ(target.command("burst " + std::to_string(kPerThread), std::chrono::seconds(300)), kThreads * kPerThread);
    auto first = iprobe({"report", pid, "--json"});
    ASSERT_EQ(first.exit_code, 0) << first.err;
    EXPECT_EQ(json_calls(first.out, "counted"), 64000000) << first.out;
    EXPECT_NE(first.out.find("\"name\":\"counted\",\"calls\":64000000,\"completed\":64000000,\"timed\":64000000"),
              std::string::npos)
        << first.out;
    EXPECT_EQ(json_number(first.out, "lost"), 0) << first.out;
    EXPECT_GT(json_number(first.out, "trace_dropped"), 0) << "the default ring cannot hold 128M events: " << first.out;
    auto second = iprobe({"report", pid, "--json"});
    EXPECT_EQ(second.out, first.out) << "reading changed the answer";
    // The stream's drops are shown per thread by status and trace.
    auto st = iprobe({"status", pid, "--json"});
    EXPECT_EQ(json_number(st.out, "trace_dropped"), json_number(first.out, "trace_dropped")) << st.out;
    EXPECT_NE(st.out.find("\"state\":\"owned\""), std::string::npos) << st.out;
    auto t = iprobe({"trace", pid, "--duration", "0", "--format", "json"});
    EXPECT_NE(t.err.find("events dropped"), std::string::npos) << t.err;
    EXPECT_NE(t.err.find("tid "), std::string::npos) << t.err;
    // Neither status nor the trace reader changed the sums.
    EXPECT_EQ(iprobe({"report", pid, "--json"}).out, first.out);
    ASSERT_EQ(iprobe({"detach", pid}).exit_code, 0);
    auto after = iprobe({"report", pid, "--json"});
    EXPECT_EQ(json_calls(after.out, "counted"), 64000000) << after.out;
}

TEST_F(HotpatchTest, ReportRunsWhileATraceReaderHoldsTheStream) {
    HpTarget target(kThreads);
    const std::string pid = pid_of(target);
    ASSERT_EQ(iprobe({"attach", pid, "--functions", "counted"}).exit_code, 0);
    CommandResult trace;
    std::thread reader([&] { trace = iprobe({"trace", pid, "--duration", "3", "--format", "json"}); });
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    EXPECT_EQ(target.command("burst 1000"), kThreads * 1000);
    auto r = iprobe({"report", pid, "--json"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(json_calls(r.out, "counted"), kThreads * 1000) << r.out;
    auto second_trace = iprobe({"trace", pid, "--duration", "0"});
    EXPECT_EQ(second_trace.exit_code, 6) << "the stream has one consumer: " << second_trace.err;
    reader.join();
    EXPECT_EQ(trace.exit_code, 0) << trace.err;
    std::size_t entries = 0;
    for (std::size_t at = 0; (at = trace.out.find("\"kind\":\"entry\"", at)) != std::string::npos; at++) entries++;
    EXPECT_EQ(entries, static_cast<std::size_t>(kThreads * 1000));
}

// A region dies with its process: kill -9 leaves nothing in /dev/shm or
// /run/iprobe, and a reader that had it open still reports the totals.
TEST_F(HotpatchTest, KilledTargetLeavesNothingButAnOpenReaderStillReports) {
    auto target = std::make_unique<HpTarget>(kThreads);
    const pid_t pid = target->pid();
    const std::string spid = std::to_string(pid);
    ASSERT_EQ(iprobe({"attach", spid, "--functions", "counted"}).exit_code, 0);
    EXPECT_EQ(target->command("burst 1000"), kThreads * 1000);
    std::string found;
    EXPECT_FALSE(leftovers_of(pid, found)) << "a region must never be a file: " << found;

    CommandResult at_exit;
    std::thread reader([&] { at_exit = iprobe({"report", spid, "--json", "--at-exit"}); });
    // Wait until the reader holds the region.
    for (int i = 0; i < 500 && region_holders(pid).empty(); i++) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ASSERT_FALSE(region_holders(pid).empty()) << "report --at-exit never took the region";
    EXPECT_EQ(target->command("burst 500"), kThreads * 500);
    target->child().kill(SIGKILL);
    target.reset();
    reader.join();
    ASSERT_EQ(at_exit.exit_code, 0) << at_exit.err;
    EXPECT_EQ(json_calls(at_exit.out, "counted"), kThreads * 1500) << at_exit.out;
    found.clear();
    EXPECT_FALSE(leftovers_of(pid, found)) << found;
    EXPECT_TRUE(region_holders(pid).empty()) << "nobody holds the region once its reader is done";
}

// A probe list is checked whole before the first byte is written: each bad
// record is exit 3 naming it, quickly, with the target untouched (code,
// runtime, region).
TEST_F(HotpatchTest, CorruptProbeListsChangeNothing) {
    HpTarget target(4);
    const std::string pid = pid_of(target);
    const auto before = text_of(target.pid(), "/hp_target");
    const auto good = file_bytes(targets_dir() + "/hp_target.probes");
    TempDir dir;
    auto rec = [](std::vector<std::uint8_t>& b, std::size_t i) {
        return reinterpret_cast<iprobe_pl_record*>(b.data() + sizeof(iprobe_pl_header) + i * sizeof(iprobe_pl_record));
    };
    const std::size_t count = reinterpret_cast<const iprobe_pl_header*>(good.data())->probe_count;
    ASSERT_GE(count, 4u);
    auto mutable_good = good;
    const std::size_t last_site = rec(mutable_good, count - 1)->site_form == IPROBE_SITE_RETURN ? count - 2 : count - 1;
    struct Case {
        std::string name, says;
        std::function<void(std::vector<std::uint8_t>&)> mutate;
    };
    const std::vector<Case> cases = {
        {"id_max", "record 2: id 4294967295", [&](auto& b) { rec(b, 2)->id = 0xffffffff; }},
        {"id_high", "record 2: id 2147483651", [&](auto& b) { rec(b, 2)->id = 0x80000003; }},
        {"id_duplicate", "record 0: id 3", [&](auto& b) { rec(b, 0)->id = 3; }},
        // the last site (an exit of form `return` moves with its entry's site)
        {"site_far", "record " + std::to_string(last_site) + ": site_address 0x7fff00000000 is outside the executable",
         [&](auto& b) {
             for (std::size_t i = last_site; i < count; i++) rec(b, i)->site_address = 0x7fff00000000ull;
         }},
        {"count_huge", "do not fit in the file",
         [&](auto& b) { reinterpret_cast<iprobe_pl_header*>(b.data())->probe_count = 0x7fffffff; }},
        {"wrong_bytes", "record 1: site", [&](auto& b) { rec(b, 1)->placeholder_bytes[0] ^= 0xff; }},
    };
    for (const auto& c : cases) {
        auto bytes = good;
        c.mutate(bytes);
        const std::string list = dir / (c.name + ".probes");
        std::ofstream(list, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
        const auto started = std::chrono::steady_clock::now();
        auto r = iprobe({"attach", pid, "--probes", list});
        const auto took = std::chrono::steady_clock::now() - started;
        EXPECT_EQ(r.exit_code, 3) << c.name << ": " << r.err;
        EXPECT_NE(r.err.find(c.says), std::string::npos) << c.name << ": " << r.err;
        EXPECT_NE(r.err.find(list), std::string::npos) << c.name << ": the message names the file: " << r.err;
        EXPECT_LT(took, std::chrono::seconds(2)) << c.name;
        EXPECT_EQ(text_of(target.pid(), "/hp_target"), before) << c.name;
        EXPECT_EQ(file_text("/proc/" + pid + "/maps").find("libiprobe-rt"), std::string::npos) << c.name;
        EXPECT_NE(::access(("/dev/shm/iprobe." + pid).c_str(), F_OK), 0) << c.name << ": a region was left";
    }
    EXPECT_EQ(target.command("burst 10"), 4 * 10);
}

// The target's own iprobe region, opened for writing as its owner could:
// the memfd it holds.
struct WritableRegion {
    int fd = -1;
    void* base = nullptr;
    std::size_t size = 0;
    explicit WritableRegion(pid_t pid) {
        const std::string memfd = "/memfd:" IPROBE_RT_MEMFD_PREFIX + std::to_string(pid) + " ";
        for (const auto& entry : fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd")) {
            std::error_code ec;
            if ((fs::read_symlink(entry.path(), ec).string() + " ").rfind(memfd, 0) != 0) continue;
            fd = ::open(entry.path().c_str(), O_RDWR | O_CLOEXEC);
            struct stat st {};
            if (fd < 0 || ::fstat(fd, &st) != 0) break;
            size = static_cast<std::size_t>(st.st_size);
            base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            break;
        }
    }
    ~WritableRegion() {
        if (base && base != MAP_FAILED) ::munmap(base, size);
        if (fd >= 0) ::close(fd);
    }
    bool ok() const { return base && base != MAP_FAILED; }
    iprobe_rt_control* control() const { return static_cast<iprobe_rt_control*>(base); }
    template <typename T>
    T* at(std::uint64_t offset) const { return reinterpret_cast<T*>(static_cast<char*>(base) + offset); }
};

// Root's detach and status take sites, lists and stubs from the process's
// maps and code: a region its owner rewrote (sites moved, flags cleared,
// the probe-list path a FIFO, the module path elsewhere) changes nothing.
TEST_F(HotpatchTest, DetachAndStatusReadTheCodeNotARegionTheTargetRewrote) {
    HpTarget target(2);
    const std::string pid = pid_of(target);
    const auto before = text_of(target.pid(), "/hp_target");
    ASSERT_EQ(iprobe({"attach", pid, "--functions", "counted,work"}).exit_code, 0);
    ASSERT_NE(text_of(target.pid(), "/hp_target"), before);

    TempDir dir;
    const std::string fifo = dir / "list.fifo";
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    {
        WritableRegion region(target.pid());
        ASSERT_TRUE(region.ok()) << "cannot open the region of " << pid;
        iprobe_rt_control* cb = region.control();
        auto* module = region.at<iprobe_rt_module>(cb->modules_offset);
        std::snprintf(module->probes_path, sizeof module->probes_path, "%s", fifo.c_str());
        std::snprintf(module->path, sizeof module->path, "/usr/bin/elsewhere");
        auto* probes = region.at<iprobe_rt_probe>(cb->probes_offset);
        for (std::uint32_t i = 0; i < cb->probe_count; i++) {
            probes[i].site += 0x1000;
            probes[i].enabled = 0;
        }
    }

    auto st = iprobe({"status", pid, "--json"}, std::chrono::seconds(10));
    ASSERT_EQ(st.exit_code, 0) << st.err;
    EXPECT_EQ(json_number(st.out, "live"), 4) << "entry and exit of counted and work, read from the code: " << st.out;
    EXPECT_EQ(json_number(st.out, "enabled"), 0) << st.out;

    auto d = iprobe({"detach", pid, "--json"}, std::chrono::seconds(10));
    ASSERT_EQ(d.exit_code, 0) << d.err;
    EXPECT_EQ(json_number(d.out, "disabled"), 4) << d.out;
    EXPECT_EQ(json_number(d.out, "still_enabled"), 0) << d.out;
    EXPECT_EQ(json_number(d.out, "not_restored"), 0) << d.out;
    EXPECT_EQ(text_of(target.pid(), "/hp_target"), before) << "code differs after detach";
    st = iprobe({"status", pid, "--json"}, std::chrono::seconds(10));
    EXPECT_EQ(json_number(st.out, "live"), 0) << st.out;
    EXPECT_EQ(target.command("burst 10"), 2 * 10);
}

TEST_F(HotpatchTest, NumbersThatWouldWrapAreUsageErrors) {
    HpTarget target(1);
    for (const std::string& bad : {std::to_string(4294967296ll + target.pid()), std::string("99999999999"),
                                  std::to_string(target.pid()) + "x", std::string("-") + pid_of(target)}) {
        auto r = iprobe({"attach", bad});
        EXPECT_EQ(r.exit_code, 2) << bad << ": " << r.err;
        EXPECT_NE(r.err.find("PID must be a process ID"), std::string::npos) << r.err;
    }
    EXPECT_EQ(iprobe({"attach", pid_of(target), "--ring-records", "4294967297"}).exit_code, 2);
    EXPECT_EQ(iprobe({"report", pid_of(target), "--duration", "inf"}).exit_code, 2);
    EXPECT_EQ(file_text("/proc/" + pid_of(target) + "/maps").find("libiprobe-rt"), std::string::npos);
}

TEST_F(HotpatchTest, LocksOfDeadProcessesAreCleanedUp) {
    HpTarget target(1);
    ::mkdir("/run/iprobe", 0700);
    // a process that existed and is gone, as a SIGKILLed session leaves it
    Child gone({"/bin/true"});
    gone.wait();
    const std::string stale = "/run/iprobe/" + std::to_string(gone.pid()) + ".lock";
    ::close(::open(stale.c_str(), O_RDWR | O_CREAT, 0600));
    ASSERT_EQ(::access(stale.c_str(), F_OK), 0);
    ASSERT_EQ(iprobe({"attach", pid_of(target), "--functions", "counted"}).exit_code, 0);
    EXPECT_NE(::access(stale.c_str(), F_OK), 0) << stale << " was left";
    EXPECT_NE(::access(("/run/iprobe/" + pid_of(target) + ".lock").c_str(), F_OK), 0);
    ASSERT_EQ(iprobe({"detach", pid_of(target)}).exit_code, 0);
}

TEST_F(HotpatchTest, TargetKilledMidAttachFailsCleanly) {
    std::mt19937 rng(42);
    for (int round = 0; round < 12; round++) {
        auto target = std::make_unique<HpTarget>(8);
        const std::string pid = pid_of(*target);
        CommandResult a;
        std::thread t([&] { a = iprobe({"attach", pid}, std::chrono::seconds(30)); });
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % 40000));
        target->child().kill(SIGKILL);
        t.join();
        EXPECT_NE(a.exit_code, -1) << "attach must not crash or hang";
        if (a.exit_code != 0) {
            EXPECT_TRUE(a.exit_code == 1 || a.exit_code == 5) << a.err;
            EXPECT_FALSE(a.err.empty());
        }
    }
}

}  // namespace
}  // namespace iprobe::test
