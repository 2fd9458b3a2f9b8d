// An enabled probe changes no register the probed function leaves alone.
// gcc's interprocedural register allocation (which iprobe-cc keeps, see
// gcc-plugin/) lets a caller keep values in call-clobbered registers across
// a call of a function that does not touch them, so the entry stub, the
// handler and the return trampoline must keep every general register but
// rax here (the leaf's only change) and xmm0-15.  targets/regs_leaf.S: a
// hand-written caller checks them all after each call.
#include <gtest/gtest.h>

#include "hotpatch_fixture.h"

namespace iprobe::test {
namespace {

constexpr long kCalls = 200000;

class Registers : public ::testing::Test {
protected:
    void SetUp() override {
        if (!is_root()) GTEST_SKIP() << "needs root (ptrace of any process, /run/iprobe)";
        target_ = std::make_unique<HpTarget>(1, targets_dir() + "/regs_target");
        pid_ = std::to_string(target_->pid());
        ASSERT_EQ(check(), 0) << "unprobed";
    }
    long check() { return target_->command("check " + std::to_string(kCalls), std::chrono::seconds(120)); }
    void attach(const std::string& handler, const std::string& flag = "") {
        std::vector<std::string> args{"attach", pid_, "--functions", "rg_leaf", "--handler", handler};
        if (handler == "count") args.push_back("--completed");  // entry and exit, then one detached
        if (!flag.empty()) args.push_back(flag);
        auto a = iprobe(args);
        ASSERT_EQ(a.exit_code, 0) << a.err;
    }
    void detach(const std::vector<std::string>& how = {}) {
        std::vector<std::string> args{"detach", pid_};
        args.insert(args.end(), how.begin(), how.end());
        auto d = iprobe(args);
        ASSERT_EQ(d.exit_code, 0) << d.err;
    }
    long long calls() {
        auto r = iprobe({"report", pid_, "--json"});
        EXPECT_EQ(r.exit_code, 0) << r.err;
        return json_calls(r.out, "rg_leaf");
    }
    long long completed() {
        auto r = iprobe({"report", pid_, "--json"});
        EXPECT_EQ(r.exit_code, 0) << r.err;
        return json_completed(r.out, "rg_leaf");
    }
    std::unique_ptr<HpTarget> target_;
    std::string pid_;
};

TEST_F(Registers, CountHandlerEntryAndExit) {
    attach("count");
    EXPECT_EQ(check(), 0);
    EXPECT_EQ(calls(), kCalls);
    EXPECT_EQ(completed(), kCalls);
}

// The entry alone: the count stub's inlined fast path.
TEST_F(Registers, CountHandlerEntryOnly) {
    attach("count");
    detach({"--exit-only"});
    EXPECT_EQ(check(), 0);
    EXPECT_EQ(calls(), kCalls);
}

// The exit alone: the return trampoline's count fast path.
TEST_F(Registers, CountHandlerExitOnly) {
    attach("count");
    detach({"--entry-only"});
    EXPECT_EQ(check(), 0);
    EXPECT_EQ(completed(), kCalls);
}

// The trace handler: its C code on entry and the trampoline's C slow path.
TEST_F(Registers, TraceHandlerEntryAndExit) {
    attach("trace");
    EXPECT_EQ(check(), 0);
    EXPECT_EQ(calls(), kCalls);
    EXPECT_EQ(completed(), kCalls);
}

// The trace handler with one clock read a call (--no-durations): both ends'
// assembler paths (trace_fast.S), the exit's without a frame or a clock.
TEST_F(Registers, TraceHandlerWithoutDurations) {
    attach("trace", "--no-durations");
    EXPECT_EQ(check(), 0);
    EXPECT_EQ(calls(), kCalls);
    EXPECT_EQ(completed(), kCalls);
    auto r = iprobe({"report", pid_, "--json"});
    EXPECT_NE(r.out.find("\"fields\":[\"calls\",\"completed\"]"), std::string::npos) << "no times kept\n" << r.out;
    EXPECT_EQ(r.out.find("\"timed\""), std::string::npos) << r.out;
}

// The trace handler's entry alone: its assembler path (trace_fast.S).
TEST_F(Registers, TraceHandlerEntryOnly) {
    attach("trace");
    detach({"--exit-only"});
    EXPECT_EQ(check(), 0);
    EXPECT_EQ(calls(), kCalls);
    EXPECT_EQ(completed(), 0);
}

}  // namespace
}  // namespace iprobe::test
