// The entry-NOP flow end to end: hp_target built with iprobe-cc --flow=entry
// (gcc -fpatchable-function-entry=5,0, pads merged into one 5-byte NOP by
// coldpatch) is attached, counted, traced, reported and detached like any
// other coldpatched program; exits come through return trampolines
// (return_test.cpp has the hard cases).
#include <unistd.h>

#include <cstring>

#include <gtest/gtest.h>

#include "hotpatch_fixture.h"

namespace iprobe::test {
namespace {

constexpr int kThreads = 4;
constexpr long kBurst = 100000;

class EntryFlowTest : public ::testing::Test {
protected:
    void SetUp() override {
        if (!is_root()) GTEST_SKIP() << "needs root (ptrace of any process, /run/iprobe)";
    }
    const std::string binary_ = targets_dir() + "/hp_target_entry";
};

TEST_F(EntryFlowTest, ListsAnEntryAndAnExitPerOutOfLineFunction) {
    auto r = iprobe({"list", binary_, "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("\"flow\":\"entry\""), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("\"function\":\"counted\""), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("\"kind\":\"exit\",\"form\":\"return\""), std::string::npos)
        << "exits are served by the entry site's return trampoline";
    EXPECT_NE(r.out.find("\"kind\":\"point\""), std::string::npos) << "IPROBE_POINT sites are merged in";
}

TEST_F(EntryFlowTest, CountsAndTracesExactlyThenDetachesToIdenticalText) {
    HpTarget target(kThreads, binary_);
    const std::string pid = std::to_string(target.pid());
    const auto text_before = text_of(target.pid(), "/hp_target_entry");
    ASSERT_FALSE(text_before.empty());

    auto a = iprobe({"attach", pid, "--functions", "counted", "--handler", "count", "--completed"});
    ASSERT_EQ(a.exit_code, 0) << a.err;
    EXPECT_NE(a.out.find("enabled 2 probes"), std::string::npos) << a.out;
    EXPECT_EQ(target.command("burst " + std::to_string(kBurst)), kThreads * kBurst);
    auto r = iprobe({"report", pid, "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(json_calls(r.out, "counted"), kThreads * kBurst) << r.out;
    EXPECT_EQ(json_completed(r.out, "counted"), kThreads * kBurst) << r.out;
    ASSERT_EQ(iprobe({"detach", pid}).exit_code, 0);
    EXPECT_EQ(text_of(target.pid(), "/hp_target_entry"), text_before) << "code differs after detach";

    a = iprobe({"attach", pid, "--functions", "counted", "--ring-records", "262144"});
    ASSERT_EQ(a.exit_code, 0) << a.err;
    EXPECT_EQ(target.command("burst 1000"), kThreads * 1000);
    auto t = iprobe({"trace", pid, "--format", "json", "--duration", "0"});
    ASSERT_EQ(t.exit_code, 0) << t.err;
    std::size_t events = 0;
    for (auto at = t.out.find("\"function\":\"counted\""); at != std::string::npos;
         at = t.out.find("\"function\":\"counted\"", at + 1))
        ++events;
    EXPECT_EQ(events, static_cast<std::size_t>(2 * kThreads * 1000)) << "an entry and an exit per call";
    ASSERT_EQ(iprobe({"detach", pid}).exit_code, 0);
    EXPECT_EQ(text_of(target.pid(), "/hp_target_entry"), text_before);

    // detached: the program still computes what it did
    EXPECT_EQ(target.command("burst 1000"), kThreads * 1000);
    EXPECT_TRUE(target.child().running());
}

// Where the enabled site `counted` jumps: the one changed 5-byte site of
// the module must be a `jmp rel32`; the first bytes of its target.
std::vector<std::uint8_t> site_target(pid_t pid, const std::vector<std::uint8_t>& before) {
    const std::vector<std::uint64_t> changed = changed_code(pid, "/hp_target_entry", before);
    if (changed.empty() || changed.back() - changed.front() >= 5) return {};
    const std::uint64_t site = changed.front();  // the jmp's opcode e9 replaced the NOP's 0f
    std::vector<std::uint8_t> jmp = memory_of(pid, site, 5);
    if (jmp.size() != 5 || jmp[0] != 0xe9) return {};
    std::int32_t rel;
    std::memcpy(&rel, jmp.data() + 1, 4);
    return memory_of(pid, site + 5 + static_cast<std::int64_t>(rel), 7);
}

// The count handler turns the entry on alone: calls exact, the exit left as
// it was (the site jumps to the stub that counts inline and jumps back to
// the function: no return trampoline, no return stack), and the report has
// no `completed` nor times for it, rather than zeros.  --completed turns the
// exit on too.
TEST_F(EntryFlowTest, CountHandlerTurnsTheEntryOnAloneUnlessCompletedCallsAreAskedFor) {
    HpTarget target(kThreads, binary_);
    const std::string pid = std::to_string(target.pid());
    const auto text_before = text_of(target.pid(), "/hp_target_entry");
    auto a = iprobe({"attach", pid, "--functions", "counted", "--handler", "count", "--json"});
    ASSERT_EQ(a.exit_code, 0) << a.err;
    EXPECT_EQ(json_number(a.out, "enabled"), 1) << a.out;
    EXPECT_EQ(json_number(a.out, "exits_left_off"), 1) << a.out;
    const std::vector<std::uint8_t> inline_count = {0x41, 0x53, 0x64, 0x4c, 0x8b, 0x1c, 0x25};  // push %r11; mov %fs:..,%r11
    EXPECT_EQ(site_target(target.pid(), text_before), inline_count) << "the entry-only count stub";
    EXPECT_EQ(target.command("burst " + std::to_string(kBurst)), kThreads * kBurst);
    auto r = iprobe({"report", pid, "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(json_calls(r.out, "counted"), kThreads * kBurst) << r.out;
    EXPECT_EQ(json_completed(r.out, "counted"), -1) << "completed is absent, not 0: " << r.out;
    EXPECT_NE(r.out.find("\"fields\":[\"calls\"]"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("inclusive_ns"), std::string::npos) << r.out;
    r = iprobe({"report", pid});
    EXPECT_NE(r.out.find("-: not kept by the handler"), std::string::npos) << r.out;
    ASSERT_EQ(iprobe({"detach", pid}).exit_code, 0);
    EXPECT_EQ(text_of(target.pid(), "/hp_target_entry"), text_before);

    a = iprobe({"attach", pid, "--functions", "counted", "--handler", "count", "--completed", "--json"});
    ASSERT_EQ(a.exit_code, 0) << a.err;
    EXPECT_EQ(json_number(a.out, "enabled"), 2) << a.out;
    const std::vector<std::uint8_t> push_site_end = {0xff, 0x35};  // the entry-and-exit stub: push site_end(%rip)
    const auto both = site_target(target.pid(), text_before);
    ASSERT_GE(both.size(), 2u);
    EXPECT_EQ(std::vector<std::uint8_t>(both.begin(), both.begin() + 2), push_site_end);
    EXPECT_EQ(target.command("burst 1000"), kThreads * 1000);
    r = iprobe({"report", pid, "--json"});
    EXPECT_EQ(json_calls(r.out, "counted"), kThreads * (kBurst + 1000)) << r.out;
    EXPECT_EQ(json_completed(r.out, "counted"), kThreads * 1000) << r.out;
    EXPECT_NE(r.out.find("\"fields\":[\"calls\",\"completed\"]"), std::string::npos) << r.out;
    ASSERT_EQ(iprobe({"detach", pid}).exit_code, 0);
    EXPECT_EQ(text_of(target.pid(), "/hp_target_entry"), text_before);
    EXPECT_EQ(iprobe({"attach", pid, "--handler", "trace", "--completed"}).exit_code, 2) << "--completed is count's";
}

// A real service built the way users build it: redis from Debian source with
// CC="iprobe-cc --flow=entry".  Every SET the client sends is counted once.
TEST_F(EntryFlowTest, RedisCommandsCountedExactlyWhileServing) {
    const std::string server = build_redis("entry");
    ASSERT_FALSE(server.empty());
    const std::string dir = server.substr(0, server.rfind('/'));
    TempDir tmp;
    RedisServer redis(server, tmp);
    ASSERT_TRUE(redis.ready());
    const int port = redis.port();
    const std::string pid = std::to_string(redis.pid());
    const auto text_before = text_of(redis.pid(), "/redis-server");

    auto a = iprobe({"attach", pid, "--functions", "setCommand,getCommand", "--handler", "count", "--completed"});
    ASSERT_EQ(a.exit_code, 0) << a.err;
    EXPECT_NE(a.out.find("enabled 4 probes"), std::string::npos) << a.out;
    constexpr int kRequests = 5000;
    auto bench = run({dir + "/redis-benchmark", "-p", std::to_string(port), "-t", "set,get", "-n",
                      std::to_string(kRequests), "-c", "4", "-P", "8", "-q"});
    ASSERT_EQ(bench.exit_code, 0) << bench.err;
    auto r = iprobe({"report", pid, "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(json_calls(r.out, "setCommand"), kRequests) << r.out;
    EXPECT_EQ(json_calls(r.out, "getCommand"), kRequests) << r.out;
    EXPECT_EQ(json_completed(r.out, "setCommand"), kRequests) << r.out;
    EXPECT_EQ(json_completed(r.out, "getCommand"), kRequests) << r.out;
    ASSERT_EQ(iprobe({"detach", pid}).exit_code, 0);
    EXPECT_EQ(text_of(redis.pid(), "/redis-server"), text_before) << "code differs after detach";
    EXPECT_TRUE(redis.running());
}

}  // namespace
}  // namespace iprobe::test
