// `iprobe attach --when / --min-duration / --retval` and `report --hist`
// end to end on a program built -O2 -g with iprobe-cc's entry flow
// (targets/when_target.c): exactly the matching calls recorded, `calls`
// exact for every call, across a change of condition and a detach.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "hotpatch_fixture.h"

namespace iprobe::test {
namespace {

using nlohmann::json;

long long fibonacci(int n) { return n < 2 ? n : fibonacci(n - 1) + fibonacci(n - 2); }
// Calls of fib(n) computing fib(top): the tree's size...
long long fib_calls(int top) { return 2 * fibonacci(top + 1) - 1; }
// ...and how many of them have argument n (n >= 1).
long long fib_calls_with(int top, int n) { return top < n ? 0 : fibonacci(top - n + 1); }

class WhenTest : public ::testing::Test {
protected:
    void SetUp() override {
        if (!is_root()) GTEST_SKIP() << "needs root (ptrace of any process, /run/iprobe)";
        target_ = std::make_unique<HpTarget>(1, targets_dir() + "/when_target");
        pid_ = std::to_string(target_->pid());
    }
    CommandResult attach(std::vector<std::string> more) {
        std::vector<std::string> args{"attach", pid_};
        args.insert(args.end(), more.begin(), more.end());
        return iprobe(args);
    }
    void attached(std::vector<std::string> more) {
        const auto a = attach(std::move(more));
        ASSERT_EQ(a.exit_code, 0) << a.err;
    }
    long command(const std::string& line) { return target_->command(line); }
    json report(const std::vector<std::string>& more = {}) {
        std::vector<std::string> args{"report", pid_, "--json"};
        args.insert(args.end(), more.begin(), more.end());
        const auto r = iprobe(args);
        EXPECT_EQ(r.exit_code, 0) << r.err;
        return json::parse(r.out);
    }
    static json function(const json& report, const std::string& name) {
        for (const auto& f : report["functions"])
            if (f["name"] == name) return f;
        return json::object();
    }
    // Entry and exit events of `name` in the stream (drains it).
    std::pair<long long, long long> events(const std::string& name) {
        const auto t = iprobe({"trace", pid_, "--duration", "0.3", "--format", "json"});
        EXPECT_EQ(t.exit_code, 0) << t.err;
        long long entries = 0, exits = 0;
        std::size_t from = 0;
        for (std::size_t end; (end = t.out.find('\n', from)) != std::string::npos; from = end + 1) {
            const json e = json::parse(t.out.substr(from, end - from));
            if (e.value("function", "") != name) continue;
            (e["kind"] == "entry" ? entries : exits)++;
        }
        return {entries, exits};
    }

    std::unique_ptr<HpTarget> target_;
    std::string pid_;
};

TEST_F(WhenTest, RecursiveFunctionRecordsExactlyTheMatchingCalls) {
    attached({"--functions", "fib", "--when", "n == 10"});
    constexpr int kRuns = 3;
    for (int i = 0; i < kRuns; i++) ASSERT_EQ(command("fib 15"), fibonacci(15));
    json fib = function(report(), "fib");
    EXPECT_EQ(fib["calls"], kRuns * fib_calls(15)) << fib;
    EXPECT_EQ(fib["completed"], kRuns * fib_calls(15)) << fib;
    EXPECT_EQ(fib["matched"], kRuns * fib_calls_with(15, 10)) << fib;
    EXPECT_EQ(fib["undecided"], 0) << fib;
    EXPECT_EQ(fib["timed"], kRuns * fib_calls_with(15, 10)) << "the times are the matching calls'\n" << fib;
    EXPECT_EQ(events("fib"), std::make_pair(kRuns * fib_calls_with(15, 10), kRuns * fib_calls_with(15, 10)));

    // Another condition on the running process; then none at all.
    attached({"--functions", "fib", "--when", "n == 12 || n == 3"});
    ASSERT_EQ(command("fib 15"), fibonacci(15));
    fib = function(report(), "fib");
    const long long matched = kRuns * fib_calls_with(15, 10) + fib_calls_with(15, 12) + fib_calls_with(15, 3);
    EXPECT_EQ(fib["calls"], (kRuns + 1) * fib_calls(15)) << fib;
    EXPECT_EQ(fib["matched"], matched) << fib;
    EXPECT_EQ(events("fib"), std::make_pair(fib_calls_with(15, 12) + fib_calls_with(15, 3),
                                            fib_calls_with(15, 12) + fib_calls_with(15, 3)));
    attached({"--functions", "fib"});
    ASSERT_EQ(command("fib 12"), fibonacci(12));
    fib = function(report(), "fib");
    EXPECT_EQ(fib["calls"], (kRuns + 1) * fib_calls(15) + fib_calls(12)) << fib;
    EXPECT_EQ(fib["matched"], matched) << "no condition: nothing more matched, every event recorded\n" << fib;
    EXPECT_EQ(events("fib"), std::make_pair(fib_calls(12), fib_calls(12)));

    // Detached: nothing more counted, the counts stay.
    ASSERT_EQ(iprobe({"detach", pid_}).exit_code, 0);
    ASSERT_EQ(command("fib 15"), fibonacci(15));
    fib = function(report(), "fib");
    EXPECT_EQ(fib["calls"], (kRuns + 1) * fib_calls(15) + fib_calls(12)) << fib;
}

TEST_F(WhenTest, StringConditionReadsBadPointersSafely) {
    attached({"--functions", "lookup", "--when", "key == \"user:42\""});
    // keys cycle "user:41", "user:42", "other", NULL, (char*)8: 4 cycles
    ASSERT_NE(command("lookup 20"), 0);
    json f = function(report(), "lookup");
    EXPECT_EQ(f["calls"], 20) << f;
    EXPECT_EQ(f["matched"], 4) << f;
    EXPECT_EQ(events("lookup"), std::make_pair(4LL, 4LL));
    attached({"--functions", "lookup", "--when", "key != \"user:42\" && len >= 10"});
    ASSERT_NE(command("lookup 20"), 0);
    f = function(report(), "lookup");
    EXPECT_EQ(f["matched"], 4 + 8) << "i = 10..19 but the two user:42\n" << f;
    EXPECT_TRUE(target_->child().running());
}

// Decided at exit: the entry's event is written with the exit's, at its own time.
TEST_F(WhenTest, DurationConditionAndMinDuration) {
    // 300 ms against a call of usleep(0): far apart on any machine, loaded or not.
    for (const auto& how : {std::vector<std::string>{"--when", "duration > 150ms"},
                            std::vector<std::string>{"--min-duration", "150ms"}}) {
        std::vector<std::string> args{"--functions", "sleepy"};
        args.insert(args.end(), how.begin(), how.end());
        attached(args);
        for (const char* line : {"sleepy 0", "sleepy 300000", "sleepy 0", "sleepy 0", "sleepy 300000"}) command(line);
        EXPECT_EQ(events("sleepy"), std::make_pair(2LL, 2LL)) << how[0];
    }
    const json f = function(report(), "sleepy");
    EXPECT_EQ(f["timed"], 10) << "decided at exit: every call timed\n" << f;
    EXPECT_EQ(f["calls"], 10) << f;
    EXPECT_EQ(f["completed"], 10) << f;
    EXPECT_EQ(f["matched"], 4) << f;
}

// With the values captured (--args --retval): the recorded events carry
// them, also when the entry is written at exit with its exit.
TEST_F(WhenTest, RecordedEventsCarryTheirValues) {
    attached({"--functions", "fib", "--when", "n == 10", "--args", "--retval"});
    ASSERT_EQ(command("fib 12"), fibonacci(12));
    const auto t = iprobe({"trace", pid_, "--duration", "0.3", "--format", "text"});
    ASSERT_EQ(t.exit_code, 0) << t.err;
    std::size_t entries = 0, exits = 0;
    for (std::size_t at = 0; (at = t.out.find("-> fib(n=10)", at)) != std::string::npos; at++) entries++;
    for (std::size_t at = 0; (at = t.out.find("<- fib(n=10) = 55", at)) != std::string::npos; at++) exits++;
    EXPECT_EQ(entries, static_cast<std::size_t>(fib_calls_with(12, 10))) << t.out;
    EXPECT_EQ(exits, static_cast<std::size_t>(fib_calls_with(12, 10))) << t.out;
    EXPECT_EQ(t.out.find("n=9"), std::string::npos) << t.out;

    attached({"--functions", "sleepy", "--when", "duration > 150ms && us > 0", "--args", "--retval"});
    for (const char* line : {"sleepy 0", "sleepy 300000"}) command(line);
    const auto s = iprobe({"trace", pid_, "--duration", "0.3", "--format", "text"});
    EXPECT_NE(s.out.find("-> sleepy(us=300000)"), std::string::npos) << s.out;
    EXPECT_NE(s.out.find("<- sleepy(us=300000) = 0"), std::string::npos) << s.out;
    EXPECT_EQ(s.out.find("us=0"), std::string::npos) << s.out;
    EXPECT_EQ(function(report(), "sleepy")["matched"], 1);
}

TEST_F(WhenTest, NamesAFunctionLacksAreRefusedAndNothingChanges) {
    const auto a = attach({"--functions", "fib,lookup", "--when", "len > 3"});
    EXPECT_EQ(a.exit_code, 3) << a.err;
    EXPECT_NE(a.err.find("--when 'len > 3' names what 1 selected function does not have:"), std::string::npos) << a.err;
    EXPECT_NE(a.err.find("fib lacks 'len' (has n)"), std::string::npos) << a.err;
    const auto b = attach({"--functions", "fib,lookup", "--when", "count == 3"});
    EXPECT_EQ(b.exit_code, 3) << b.err;
    EXPECT_NE(b.err.find("lookup lacks 'count' (has key, len)"), std::string::npos) << b.err;
    const auto c = attach({"--functions", "fib", "--when", "n == 10 &&"});
    EXPECT_EQ(c.exit_code, 3) << c.err;
    EXPECT_NE(c.err.find("expected a value\n  n == 10 &&\n            ^"), std::string::npos) << c.err;
    const auto d = attach({"--functions", "fib", "--when", "n == 1", "--handler", "count"});
    EXPECT_EQ(d.exit_code, 2) << d.err;
    const auto status = iprobe({"status", pid_, "--json"});
    EXPECT_EQ(status.out.find("\"enabled\":true"), std::string::npos) << "nothing was enabled\n" << status.out;
    ASSERT_EQ(command("fib 10"), fibonacci(10));
    EXPECT_TRUE(target_->child().running());
}

TEST_F(WhenTest, HistogramBucketsAddUpToTheCalls) {
    attached({"--functions", "fib", "--retval"});
    constexpr int kRuns = 2;
    for (int i = 0; i < kRuns; i++) ASSERT_EQ(command("fib 15"), fibonacci(15));
    const json f = function(report({"--hist"}), "fib");
    long long latency = 0, values = 0, zero = 0, one = 0;
    for (const auto& b : f["histogram"]) latency += b["count"].get<long long>();
    for (const auto& b : f["retval_histogram"]) {
        values += b["count"].get<long long>();
        if (b["low"] == 0 && b["high"] == 0) zero = b["count"];
        if (b["low"] == 1 && b["high"] == 1) one = b["count"];
    }
    EXPECT_EQ(f["calls"], kRuns * fib_calls(15)) << f;
    EXPECT_EQ(latency, kRuns * fib_calls(15)) << f;
    EXPECT_EQ(values, kRuns * fib_calls(15)) << f;
    // fib(0) returns 0, fib(1) and fib(2) return 1
    EXPECT_EQ(zero, kRuns * fibonacci(14)) << f;
    EXPECT_EQ(one, kRuns * (fib_calls_with(15, 1) + fib_calls_with(15, 2))) << f;
    const auto text = iprobe({"report", pid_, "--hist"});
    EXPECT_EQ(text.exit_code, 0) << text.err;
    EXPECT_NE(text.out.find("fib: latency of " + std::to_string(kRuns * fib_calls(15)) + " timed calls"), std::string::npos)
        << text.out;
    EXPECT_NE(text.out.find("fib: return value of " + std::to_string(kRuns * fib_calls(15)) + " calls"), std::string::npos)
        << text.out;
}

// The count handler turns entries on alone: what needs exits (a --when, a
// --min-duration, --retval) is refused with it (exit 2),
// and report --hist shows no latency histogram where no times were kept.
TEST_F(WhenTest, CountHandlerRefusesWhatNeedsExitsAndShowsNoLatencyItDidNotKeep) {
    for (const std::vector<std::string>& more : {std::vector<std::string>{"--when", "n == 3"},
                                                 std::vector<std::string>{"--min-duration", "1ms"},
                                                 std::vector<std::string>{"--retval"}}) {
        std::vector<std::string> args{"--functions", "fib", "--handler", "count"};
        args.insert(args.end(), more.begin(), more.end());
        const auto a = attach(args);
        EXPECT_EQ(a.exit_code, 2) << more.front() << ": " << a.err;
    }
    attached({"--functions", "fib", "--handler", "count"});
    ASSERT_EQ(command("fib 10"), fibonacci(10));
    const json f = function(report({"--hist"}), "fib");
    EXPECT_EQ(f["calls"], fib_calls(10)) << f;
    EXPECT_FALSE(f.contains("completed")) << f;
    EXPECT_FALSE(f.contains("histogram")) << "no times kept, no latency histogram\n" << f;
    EXPECT_FALSE(f.contains("retval_histogram")) << f;
    const auto text = iprobe({"report", pid_, "--hist"});
    EXPECT_EQ(text.exit_code, 0) << text.err;
    EXPECT_NE(text.out.find("fib: no latency histogram"), std::string::npos) << text.out;
    EXPECT_EQ(text.out.find("fib: latency of"), std::string::npos) << text.out;
}

// Values events (an ENTRY and its continuation record, an EXIT without:
// three records a call, so events straddle the ring's wrap) through a ring
// of 64 records, drained by a --lossless reader: the threads wait for it,
// every event arrives whole, its values decoded across the wrap.
TEST_F(WhenTest, LosslessTraceKeepsEveryValuesEventWhole) {
    attached({"--functions", "fib", "--args", "--ring-records", "64"});
    TempDir dir;
    const std::string out = dir / "trace.json";
    Child trace({iprobe_bin(), "trace", pid_, "--lossless", "--format", "json"}, out);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the reader is draining
    constexpr int kTop = 15;
    ASSERT_EQ(command("fib " + std::to_string(kTop)), fibonacci(kTop));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    trace.kill(SIGINT);
    ASSERT_EQ(trace.wait(std::chrono::seconds(60)), 0);
    std::ifstream in(out);
    long long entries = 0, exits = 0, with_n1 = 0, wrong = 0;
    for (std::string line; std::getline(in, line);) {
        const json e = json::parse(line);
        if (e.value("function", "") != "fib") continue;
        if (e["kind"] == "entry") {
            entries++;
            if (!e.contains("args") || e["args"].size() != 1 || e["args"][0]["name"] != "n") wrong++;
            else if (e["args"][0]["value"] == 1) with_n1++;
        } else {
            exits++;
        }
    }
    EXPECT_EQ(entries, fib_calls(kTop));
    EXPECT_EQ(exits, fib_calls(kTop));
    EXPECT_EQ(with_n1, fib_calls_with(kTop, 1));
    EXPECT_EQ(wrong, 0);
    EXPECT_EQ(json_number(iprobe({"report", pid_, "--json"}).out, "trace_dropped"), 0);
}

}  // namespace
}  // namespace iprobe::test
