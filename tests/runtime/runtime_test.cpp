// The runtime's edge cases: signal-handler re-entrancy, fork, thread exit
// (ring reclaimed), events before a region is mapped.
#include <dlfcn.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>

#include <thread>

#include "hotpatch_fixture.h"
#include "iprobe/runtime/rt.h"

namespace iprobe::test {
namespace {

class RuntimeTest : public ::testing::Test {
protected:
    void SetUp() override {
        if (!is_root()) GTEST_SKIP() << "needs root (ptrace)";
    }
};

TEST_F(RuntimeTest, SignalHandlerRunningAProbedFunctionMidRecordLosesNothing) {
    HpTarget target(1);
    const std::string pid = std::to_string(target.pid());
    ASSERT_EQ(iprobe({"attach", pid, "--functions", "counted,in_signal", "--ring-records", "1048576"}).exit_code, 0);
    const long handlers = target.command("signals 300000");
    ASSERT_GT(handlers, 100) << "the signal sender did not interrupt the loop";
    auto r = iprobe({"report", pid, "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(json_calls(r.out, "counted"), 300000) << r.out;
    EXPECT_EQ(json_calls(r.out, "in_signal"), handlers) << r.out;
    EXPECT_EQ(json_number(r.out, "trace_dropped"), 0) << r.out;
    // every entry found its exit: nesting was recorded in order
    EXPECT_NE(r.out.find("\"name\":\"counted\",\"calls\":300000,\"completed\":300000"), std::string::npos) << r.out;
}

TEST_F(RuntimeTest, ForkedChildNeverWritesIntoTheParentsRings) {
    HpTarget target(2);
    const std::string pid = std::to_string(target.pid());
    ASSERT_EQ(iprobe({"attach", pid, "--functions", "counted"}).exit_code, 0);
    EXPECT_EQ(target.command("fork 20000"), 0) << "child must exit cleanly";
    auto r = iprobe({"report", pid, "--json"});
    EXPECT_EQ(json_calls(r.out, "counted"), -1) << "child events leaked into the parent: " << r.out;
    EXPECT_EQ(target.command("burst 100"), 200);
    r = iprobe({"report", pid, "--json"});
    EXPECT_EQ(json_calls(r.out, "counted"), 200) << r.out;
}

// The count handler is inlined into each site's stub: its one add must not
// lose a count to a signal handler probing in between, and a forked child,
// which inherits the stubs and its parent's thread state, must not count
// into the parent's sums.
TEST_F(RuntimeTest, InlinedCountStubsAreExactUnderSignalsAndSilentInAForkedChild) {
    HpTarget target(2);
    const std::string pid = std::to_string(target.pid());
    ASSERT_EQ(iprobe({"attach", pid, "--handler", "count", "--completed", "--functions", "counted,in_signal"}).exit_code, 0);
    const long handlers = target.command("signals 300000");
    ASSERT_GT(handlers, 100) << "the signal sender did not interrupt the loop";
    auto r = iprobe({"report", pid, "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("\"name\":\"counted\",\"calls\":300000,\"completed\":300000"), std::string::npos) << r.out;
    EXPECT_EQ(json_calls(r.out, "in_signal"), handlers) << r.out;
    EXPECT_EQ(target.command("fork 20000"), 0) << "child must exit cleanly";
    r = iprobe({"report", pid, "--json"});
    EXPECT_EQ(json_calls(r.out, "counted"), 300000) << "the child counted into the parent: " << r.out;
    EXPECT_EQ(target.command("burst 100"), 200);
    r = iprobe({"report", pid, "--json"});
    EXPECT_EQ(json_calls(r.out, "counted"), 300200) << r.out;
}

TEST_F(RuntimeTest, RingsOfExitedThreadsAreReclaimed) {
    HpTarget target(1);
    const std::string pid = std::to_string(target.pid());
    // 512 slots and rings; 2 x 300 short-lived threads only fit if exited
    // threads' slots and rings are reused (the slots keep summing)
    ASSERT_EQ(iprobe({"attach", pid, "--functions", "counted", "--ring-records", "1024"}).exit_code, 0);
    for (int round = 0; round < 2; round++) {
        EXPECT_EQ(target.command("churn 300 10"), 3000);
        auto r = iprobe({"report", pid, "--json"});
        EXPECT_EQ(json_calls(r.out, "counted"), 3000 * (round + 1)) << "round " << round << ": " << r.out;
        EXPECT_EQ(json_number(r.out, "lost"), 0) << r.out;
    }
    auto s = iprobe({"status", pid, "--json"});
    EXPECT_EQ(json_number(s.out, "no_ring_events"), 0) << "retired rings are taken over: " << s.out;
    ASSERT_EQ(iprobe({"trace", pid, "--duration", "0"}).exit_code, 0);
    s = iprobe({"status", pid, "--json"});
    EXPECT_EQ(s.out.find("\"state\":\"retired\""), std::string::npos) << "drained rings are freed: " << s.out;
}

TEST_F(RuntimeTest, ExecReplacesTheImageAndANewAttachStartsAfresh) {
    HpTarget target(2);
    const std::string pid = std::to_string(target.pid());
    ASSERT_EQ(iprobe({"attach", pid, "--functions", "counted"}).exit_code, 0);
    EXPECT_EQ(target.command("burst 10"), 20);
    target.command("exec");
    for (int i = 0; i < 500; i++) {
        const std::string out = target.output();
        if (out.find("ready", out.find("ok exec")) != std::string::npos) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    // the new image has neither the runtime nor enabled sites; the old region is stale
    EXPECT_EQ(file_text("/proc/" + pid + "/maps").find("libiprobe-rt"), std::string::npos);
    auto a = iprobe({"attach", pid, "--functions", "counted"});
    ASSERT_EQ(a.exit_code, 0) << a.err;
    EXPECT_NE(a.out.find("runtime injected"), std::string::npos) << a.out;
    EXPECT_EQ(target.command("burst 100"), 200);
    auto r = iprobe({"report", pid, "--json"});
    EXPECT_EQ(json_calls(r.out, "counted"), 200) << r.out;
}

// Without an invariant TSC (forced here) the runtime times with
// CLOCK_MONOTONIC: sums and event times stay right.
TEST_F(RuntimeTest, MonotonicClockWhereTheTscIsNotInvariant) {
    HpTarget target(2);
    const std::string pid = std::to_string(target.pid());
    auto a = run({iprobe_bin(), "attach", pid, "--functions", "counted"}, {}, std::chrono::seconds(60),
                 {"IPROBE_CLOCK=monotonic"});
    ASSERT_EQ(a.exit_code, 0) << a.err;
    const auto before = std::chrono::system_clock::now();
    EXPECT_EQ(target.command("burst 1000"), 2000);
    auto r = iprobe({"report", pid, "--json"});
    EXPECT_NE(r.out.find("\"name\":\"counted\",\"calls\":2000,\"completed\":2000,\"timed\":2000"), std::string::npos)
        << r.out;
    EXPECT_GT(json_number(r.out, "inclusive_ns"), 0) << r.out;
    auto t = iprobe({"trace", pid, "--duration", "0", "--format", "json"});
    const long long at = json_number(t.out, "time_ns");
    const long long expected = std::chrono::duration_cast<std::chrono::nanoseconds>(before.time_since_epoch()).count();
    EXPECT_LT(std::llabs(at - expected), 5000000000ll) << "event times are wall-clock: " << t.out.substr(0, 200);
}

TEST(RuntimeInProcess, EventsBeforeARegionIsMappedAreCountedNotFatal) {
    const std::string lib = build_dir() + "/lib/libiprobe-rt.so";
    void* handle = ::dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(handle, nullptr) << ::dlerror();
    auto* state = static_cast<struct iprobe_rt_state*>(::dlsym(handle, "iprobe_rt_state"));
    auto* enter = reinterpret_cast<void (*)(void*, void*)>(::dlsym(handle, "iprobe_rt_trace_enter"));
    auto* count = reinterpret_cast<void (*)(void*, void*)>(::dlsym(handle, "iprobe_rt_count_enter"));
    auto* probe_at = reinterpret_cast<int32_t (*)(uintptr_t)>(::dlsym(handle, "iprobe_rt_probe_at"));
    ASSERT_TRUE(state && enter && count && probe_at);
    EXPECT_EQ(std::string(state->magic, 8), IPROBE_RT_STATE_MAGIC);
    const auto before = state->early_events;
    enter(nullptr, nullptr);
    count(nullptr, nullptr);
    EXPECT_EQ(state->early_events, before + 2);
    EXPECT_EQ(state->control, 0u);
    EXPECT_EQ(probe_at(reinterpret_cast<uintptr_t>(enter)), -1);
}

}  // namespace
}  // namespace iprobe::test
