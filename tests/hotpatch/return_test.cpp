// Exits through return trampolines: the hard cases (targets/rt_cases.c), in
// a C build and a C++ build of the same program made with iprobe-cc's entry
// flow.  Each case attaches to the entry and exit of the functions involved
// and checks `iprobe report`'s exact calls and completed calls against what
// the program did, and that the program computed what it computes unprobed.
#include <unistd.h>

#include <csignal>
#include <map>
#include <regex>
#include <thread>

#include <gtest/gtest.h>

#include "hotpatch_fixture.h"
#include "iprobe/formats/rt_layout.h"
#include "iprobe/hotpatch/trace_file.h"

namespace iprobe::test {
namespace {

struct Counts {
    long long calls = 0, completed = 0;
    bool operator==(const Counts&) const = default;
};

std::ostream& operator<<(std::ostream& out, const Counts& c) {
    return out << "{calls " << c.calls << ", completed " << c.completed << "}";
}

// The calls a trace file shows: per function the calls, completions and
// summed inclusive ticks (each exit against the innermost open call of its
// thread), and what broke the nesting or the order of a thread's events.
struct FileCalls {
    std::map<std::string, Counts> seen;
    std::map<std::string, long double> ticks;  // inclusive, summed
    long long mismatched = 0;                  // exits that were not the innermost open call's
    long long backwards = 0;                   // events stamped before their thread's previous one
    std::map<std::uint32_t, std::size_t> left_open;
    long long without_exit = 0;                // entries whose exit is not traced: they open no call
    long long unstamped = 0;                   // exits recorded without a time (attach --no-durations)
    long double ns_per_tick = 0;
};

FileCalls read_calls(const std::string& file) {
    struct Open {
        std::string function;
        std::uint64_t tsc;
    };
    FileCalls out;
    std::map<std::uint32_t, std::vector<Open>> open;  // per thread
    std::map<std::uint32_t, std::uint64_t> previous;
    hotpatch::Event first{}, last{};
    bool any = false;
    hotpatch::TraceFileReader reader(file);
    while (reader.next([&](const hotpatch::Event& e) {
        ASSERT_LT(e.probe, reader.probes().size());
        const std::string& f = reader.probes()[e.probe].function;
        if (e.stamped) {
            if (!any) first = e, any = true;
            last = e;
            if (previous.count(e.tid) && e.tsc < previous[e.tid]) out.backwards++;
            previous[e.tid] = e.tsc;
        }
        auto& stack = open[e.tid];
        if (e.kind == probelist::ProbeKind::entry) {
            out.seen[f].calls++;
            if (e.exit_traced) stack.push_back({f, e.tsc});
            else out.without_exit++;
            return;
        }
        out.seen[f].completed++;
        if (stack.empty() || stack.back().function != f) {
            out.mismatched++;
            return;
        }
        if (!e.stamped) out.unstamped++;
        else out.ticks[f] += static_cast<long double>(e.tsc - stack.back().tsc);
        stack.pop_back();
    })) {
    }
    for (const auto& [tid, stack] : open)
        if (!stack.empty()) out.left_open[tid] = stack.size();
    EXPECT_GT(last.tsc, first.tsc);
    if (last.tsc > first.tsc)
        out.ns_per_tick =
            static_cast<long double>(last.time_ns - first.time_ns) / static_cast<long double>(last.tsc - first.tsc);
    return out;
}

class ReturnTest : public ::testing::TestWithParam<std::string> {
protected:
    void SetUp() override {
        if (!is_root()) GTEST_SKIP() << "needs root (ptrace of any process, /run/iprobe)";
        target_ = std::make_unique<HpTarget>(1, targets_dir() + "/" + GetParam());
        pid_ = std::to_string(target_->pid());
    }

    void attach(const std::string& functions, const std::string& handler = "count") {
        std::vector<std::string> args{"attach", pid_, "--functions", functions, "--handler", handler};
        if (handler == "count") args.push_back("--completed");  // these cases count returns
        auto a = iprobe(args);
        ASSERT_EQ(a.exit_code, 0) << a.err;
    }
    long command(const std::string& line) { return target_->command(line, std::chrono::seconds(300)); }
    std::string report() {
        auto r = iprobe({"report", pid_, "--json"});
        EXPECT_EQ(r.exit_code, 0) << r.err;
        return r.out;
    }
    // `line` run while `iprobe trace --output --lossless` writes sg_*'s
    // events to a file: the target's answer, and the calls in the file.
    // `flag`: one more for the trace handler's attach (--entry-only, --no-durations).
    std::pair<long, FileCalls> trace_signals_to_file(const std::string& line, const std::string& flag = "") {
        std::vector<std::string> args{"attach", pid_, "--functions", "sg_*", "--handler", "trace"};
        if (!flag.empty()) args.push_back(flag);
        auto a = iprobe(args);
        EXPECT_EQ(a.exit_code, 0) << a.err;
        TempDir dir;
        const std::string file = dir / "signals.trace";
        Child trace({iprobe_bin(), "trace", pid_, "--output", file, "--lossless"}, dir / "trace.out");
        std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the writer is draining
        const long answer = command(line);
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        trace.kill(SIGINT);
        EXPECT_EQ(trace.wait(std::chrono::seconds(60)), 0);
        return {answer, read_calls(file)};
    }
    static Counts counts(const std::string& json, const std::string& function) {
        return {std::max(0ll, json_calls(json, function)), std::max(0ll, json_completed(json, function))};
    }

    std::unique_ptr<HpTarget> target_;
    std::string pid_;
};

INSTANTIATE_TEST_SUITE_P(CAndCxx, ReturnTest, ::testing::Values("rt_cases_c", "rt_cases_cxx"),
                         [](const auto& info) { return info.param == "rt_cases_c" ? "C" : "Cxx"; });

TEST_P(ReturnTest, ListsAnExitPerFunctionServedByItsEntrySite) {
    auto r = iprobe({"list", targets_dir() + "/" + GetParam(), "--functions", "lj_outer", "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("\"kind\":\"entry\""), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("\"kind\":\"exit\",\"form\":\"return\""), std::string::npos) << r.out;
}

// rax, rdx, xmm0, xmm1, st0 and st1 reach the caller intact, with either handler.
TEST_P(ReturnTest, ReturnValuesOfEveryClassSurvive) {
    constexpr long kCalls = 2000;
    const long expected = command("values " + std::to_string(kCalls));
    for (const std::string handler : {"count", "trace"}) {
        attach("rv_*", handler);
        EXPECT_EQ(command("values " + std::to_string(kCalls)), expected) << handler;
        ASSERT_EQ(iprobe({"detach", pid_}).exit_code, 0);
    }
    const std::string json = report();
    for (const char* f : {"rv_long", "rv_double", "rv_long_double", "rv_complex_ld", "rv_two_doubles",
                          "rv_two_longs", "rv_int128", "rv_big"})
        EXPECT_EQ(counts(json, f), (Counts{2 * kCalls, 2 * kCalls})) << f << "\n" << json;
    EXPECT_EQ(json_number(json, "timed"), kCalls) << "the trace handler times every hooked call\n" << json;
}

// Frames a longjmp abandons never return: their exits are not counted, and
// their entries (2 per jump, far more than a thread's return stack holds)
// are collected so that every later exit is still hooked.
TEST_P(ReturnTest, LongjmpSkipsTheExitsOfAbandonedFrames) {
    constexpr long kJumps = 3000;
    attach("lj_*");
    EXPECT_EQ(command("longjmp " + std::to_string(kJumps)), kJumps);
    const std::string json = report();
    EXPECT_EQ(counts(json, "lj_outer"), (Counts{kJumps, kJumps})) << json;
    EXPECT_EQ(counts(json, "lj_middle"), (Counts{kJumps, 0})) << json;
    EXPECT_EQ(counts(json, "lj_inner"), (Counts{kJumps, 0})) << json;
    EXPECT_EQ(json_number(json, "unhooked_returns"), 0) << json;
}

TEST_P(ReturnTest, SiglongjmpOutOfASignalHandler) {
    constexpr long kJumps = 2000;
    attach("sj_*");
    EXPECT_EQ(command("siglongjmp " + std::to_string(kJumps)), kJumps);
    const std::string json = report();
    EXPECT_EQ(counts(json, "sj_outer"), (Counts{kJumps, kJumps})) << json;
    EXPECT_EQ(counts(json, "sj_wait"), (Counts{kJumps, 0})) << json;
    EXPECT_EQ(counts(json, "sj_handler"), (Counts{kJumps, 0})) << json;
    EXPECT_EQ(json_number(json, "unhooked_returns"), 0) << json;
}

// setcontext jumps back like longjmp; a coroutine keeps hooked frames on
// two stacks at once, returning in no stack order.
TEST_P(ReturnTest, SetcontextAndSwapcontext) {
    constexpr long kTimes = 2000;
    attach("sc_*,co_*");
    EXPECT_EQ(command("setcontext " + std::to_string(kTimes)), kTimes);
    EXPECT_EQ(command("swapcontext " + std::to_string(kTimes)), kTimes);
    const std::string json = report();
    EXPECT_EQ(counts(json, "sc_outer"), (Counts{kTimes, kTimes})) << json;
    EXPECT_EQ(counts(json, "sc_inner"), (Counts{kTimes, 0})) << json;
    EXPECT_EQ(counts(json, "co_resume"), (Counts{kTimes + 1, kTimes + 1})) << json;
    EXPECT_EQ(counts(json, "co_step"), (Counts{kTimes, kTimes})) << json;
    EXPECT_EQ(counts(json, "co_body"), (Counts{1, 1})) << json;
    EXPECT_EQ(json_number(json, "unhooked_returns"), 0) << json;
}

// Thousands of signals land anywhere in the loop: inside entry stubs,
// inside the trampolines, between them; each handler hooks 10 more frames,
// on the thread's stack or on an alternate one.
TEST_P(ReturnTest, SignalHandlersAnywhereOnEitherStack) {
    constexpr long kCalls = 5000000;
    attach("sg_*");
    const long same_stack = command("signals " + std::to_string(kCalls));
    EXPECT_GT(same_stack, 100);
    ASSERT_EQ(iprobe({"detach", pid_}).exit_code, 0);
    attach("sg_*", "trace");
    const long alternate = command("altsignals " + std::to_string(kCalls));
    EXPECT_GT(alternate, 100);
    const long handled = same_stack + alternate;
    const std::string json = report();
    EXPECT_EQ(counts(json, "sg_leaf"), (Counts{2 * kCalls, 2 * kCalls})) << json;
    const Counts handler = counts(json, "sg_handler"), nested = counts(json, "sg_nested");
    EXPECT_EQ(handler.calls, handled) << json;
    EXPECT_EQ(nested.calls, 9 * handled) << json;
    // A signal that lands while its thread is in the return stack's slow
    // path (a new run of entries; more likely when the thread was
    // descheduled there and the signal waited) finds it busy: that
    // handler's returns are not hooked, by design, and each is counted.
    // Every missing exit is one of those, and they stay rare.
    const long long unhooked = json_number(json, "unhooked_returns");
    EXPECT_EQ((handler.calls - handler.completed) + (nested.calls - nested.completed), unhooked) << json;
    EXPECT_LE(unhooked, handled) << json;
}

// A number of one function's object in `iprobe report --json`.
long long json_field(const std::string& json, const std::string& function, const std::string& key) {
    const std::regex re("\"name\":\"" + function + "\"[^}]*\"" + key + "\":([0-9]+)");
    std::smatch m;
    return std::regex_search(json, m, re) ? std::stoll(m[1]) : -1;
}

// Frames abandoned under a function that has not returned (postgres's
// PG_TRY in a loop, a server catching each request's exception): 31 a jump
// (and, in C++, every other one a throw), 620 in all.  They piled up in the
// thread's frames past their cap (120), and from then on no call of the
// thread was timed: ab_leaf's 1000 calls completed, none timed, and after
// ab_catch, nothing else either.  The frames below the entering call are
// dropped at the cap, and an exit finds its own frame by its return slot.
TEST_P(ReturnTest, FramesAbandonedUnderACallThatGoesOnDoNotStopTheTiming) {
    constexpr long kJumps = 20;
    attach("ab_*", "trace");
    EXPECT_EQ(command("abandon " + std::to_string(kJumps)), kJumps);
    EXPECT_EQ(command("abandon " + std::to_string(kJumps)), kJumps);
    const std::string json = report();
    EXPECT_EQ(counts(json, "ab_leaf"), (Counts{2000, 2000})) << json;
    EXPECT_EQ(json_field(json, "ab_leaf", "timed"), 2000) << "every call timed\n" << json;
    EXPECT_EQ(counts(json, "ab_catch"), (Counts{2, 2})) << json;
    EXPECT_EQ(json_field(json, "ab_catch", "timed"), 2) << json;
    EXPECT_EQ(counts(json, "ab_down"), (Counts{2 * kJumps * 31, 0})) << json;
    EXPECT_GT(json_field(json, "ab_leaf", "inclusive_ns"), 0) << json;
    EXPECT_EQ(json_number(json, "unmatched_exits"), 0) << json;
}


// The trace handler's common call is served in assembler at both ends
// (runtime/src/trace_fast.S) while signals land anywhere in it and their
// handlers' traced calls nest inside.  Read back from what a lossless
// trace wrote: every entry and exit of every function, each exit the
// innermost open call's; every call timed; and the durations the file's
// timestamps give summing, function by function, to the inclusive time the
// report's sums kept.
// sg_*'s calls in the file: `handled` handlers, nine sg_nested in each,
// timed as the report's sums time them; nothing dropped or unmatched.
void expect_signal_calls(const FileCalls& calls, const std::string& json, long leaf_calls, long handled) {
    EXPECT_EQ(calls.mismatched, 0) << "exits that were not the innermost open call's";
    for (const auto& [tid, open] : calls.left_open) ADD_FAILURE() << open << " calls left open in " << tid;
    const std::map<std::string, long> called{{"sg_leaf", leaf_calls}, {"sg_handler", handled}, {"sg_nested", 9 * handled}};
    for (const auto& [f, n] : called) {
        const auto seen = calls.seen.find(f);
        EXPECT_EQ(seen == calls.seen.end() ? Counts{} : seen->second, (Counts{n, n})) << f << " in the file";
        EXPECT_EQ(json_calls(json, f), n) << f << ": every call in the sums\n" << json;
        EXPECT_EQ(json_field(json, f, "timed"), json_completed(json, f)) << f << ": every call timed\n" << json;
        const long double inclusive_ns = static_cast<long double>(json_field(json, f, "inclusive_ns"));
        const auto ticks = calls.ticks.find(f);
        const long double from_file = ticks == calls.ticks.end() ? 0 : ticks->second * calls.ns_per_tick;
        EXPECT_NEAR(static_cast<double>(from_file), static_cast<double>(inclusive_ns),
                    static_cast<double>(1e-3 * inclusive_ns + 1000))
            << f << ": the durations in the file against the report's inclusive time\n" << json;
    }
    EXPECT_EQ(json_number(json, "trace_dropped"), 0) << json;
    EXPECT_EQ(json_number(json, "unmatched_exits"), 0) << json;
    EXPECT_EQ(json_number(json, "unhooked_returns"), 0) << json;
    EXPECT_EQ(json_number(json, "lost"), 0) << json;
}

// sg_*'s calls in the file and the report of a trace that keeps no times:
// each function's entries (with `completed`, its exits too) exactly once in
// the file, and the report's calls (and completed) with fields saying that
// is all it has (nothing timed, nothing estimated).  Returns the calls.
long long expect_untimed_signal_calls(const FileCalls& calls, const std::string& json, long leaf_calls, long handled,
                                      bool completed) {
    const std::map<std::string, long> called{{"sg_leaf", leaf_calls}, {"sg_handler", handled}, {"sg_nested", 9 * handled}};
    long long total = 0;
    for (const auto& [f, n] : called) {
        const auto seen = calls.seen.find(f);
        EXPECT_EQ(seen == calls.seen.end() ? Counts{} : seen->second, (Counts{n, completed ? n : 0})) << f << " in the file";
        const std::string count = std::to_string(n);
        const std::string row = "\"name\":\"" + f + "\",\"calls\":" + count + (completed ? ",\"completed\":" + count : "") +
                                ",\"fields\":[\"calls\"" + (completed ? ",\"completed\"" : "") + "]";
        EXPECT_NE(json.find(row), std::string::npos) << f << "\n" << json;
        total += n;
    }
    return total;
}

TEST_P(ReturnTest, TraceFastPathNestsSignalHandlersAndTimesWhatTheFileShows) {
    constexpr long kCalls = 300000;
    const auto [handled, calls] = trace_signals_to_file("signals " + std::to_string(kCalls));
    EXPECT_GT(handled, 10) << "signals landed while the loop ran";
    expect_signal_calls(calls, report(), kCalls, handled);
}

// The entry alone (attach --entry-only): one clock read a call, served in
// assembler (trace_fast.S's iprobe_rt_trace_enter_id_nop) while signals land
// anywhere in it.  The lossless file holds every entry exactly once and no
// exit; the sums count every call and time none; the returns are never
// hooked.
TEST_P(ReturnTest, EntryOnlyTraceRecordsEveryEntryOnceWhileSignalsLand) {
    constexpr long kCalls = 300000;
    const auto [handled, calls] = trace_signals_to_file("signals " + std::to_string(kCalls), "--entry-only");
    EXPECT_GT(handled, 10) << "signals landed while the loop ran";
    const std::string json = report();
    const long long entries = expect_untimed_signal_calls(calls, json, kCalls, handled, false);
    // and the one call of the thread that sends the signals (sg_sender):
    // each an entry whose exit is not traced, none left open for an exit
    EXPECT_EQ(calls.without_exit, entries + 1);
    EXPECT_TRUE(calls.left_open.empty());
    EXPECT_EQ(calls.mismatched, 0);
    EXPECT_EQ(json_number(json, "trace_dropped"), 0) << json;
    EXPECT_EQ(json_number(json, "unhooked_returns"), 0) << json;
    EXPECT_EQ(json_number(json, "lost"), 0) << json;
}

// One clock read a call, at its entry (attach --no-durations): the exit is
// served in assembler too (trace_fast.S's unstamped exit), recorded in its
// place without a time, while signals land anywhere and their handlers'
// traced calls nest inside.  The lossless file holds every entry and exit
// exactly once, each exit the innermost open call's and none with a time;
// the sums count every call and completion, time none, and the report
// says that is all it has.
TEST_P(ReturnTest, TraceWithoutDurationsRecordsEveryEntryAndExitWhileSignalsLand) {
    constexpr long kCalls = 300000;
    const auto [handled, calls] = trace_signals_to_file("signals " + std::to_string(kCalls), "--no-durations");
    EXPECT_GT(handled, 10) << "signals landed while the loop ran";
    const std::string json = report();
    const long long exits = expect_untimed_signal_calls(calls, json, kCalls, handled, true);
    // and the one call of the thread that sends the signals (sg_sender)
    EXPECT_EQ(calls.unstamped, exits + 1) << "every exit without a time";
    EXPECT_TRUE(calls.ticks.empty()) << "no exit with a time";
    EXPECT_EQ(calls.mismatched, 0) << "exits that were not the innermost open call's";
    for (const auto& [tid, open] : calls.left_open) ADD_FAILURE() << open << " calls left open in " << tid;
    EXPECT_EQ(calls.without_exit, 0);
    EXPECT_EQ(json_number(json, "trace_dropped"), 0) << json;
    EXPECT_EQ(json_number(json, "unmatched_exits"), 0) << json;
    EXPECT_EQ(json_number(json, "unhooked_returns"), 0) << json;
    EXPECT_EQ(json_number(json, "lost"), 0) << json;
}

// SIGUSR2 raised inside the runtime's claims at a thread's first traced
// call (rt_cases.c's pthread_setspecific): the handler runs once the claim
// is done and before that call's clock is read, so its calls are in the
// sums as in the file, timed alike, and the thread's events are in time
// order.  (A handler inside the claim of the sums found none: its calls
// were left out of them and kept in the file, one with the ring's
// population in its duration.)
TEST_P(ReturnTest, SignalInsideAThreadsFirstTracedCallIsInTheSumsAsInTheFile) {
    constexpr long kCalls = 1000;
    const auto [result, calls] = trace_signals_to_file("firstcall " + std::to_string(kCalls));
    const long handled = result / 100, raised = result % 100;
    // One raise in each of the claims of the thread's sums, ring and return
    // stack (each registers the thread); held until the claims are done,
    // they are one pending SIGUSR2 then.
    EXPECT_EQ(raised, 3) << "the runtime's claims no longer call pthread_setspecific as this expects";
    EXPECT_EQ(handled, 1);
    EXPECT_EQ(calls.backwards, 0) << "events written after a later-stamped one of their thread";
    expect_signal_calls(calls, report(), kCalls, handled);
}

// pthread_exit and pthread_cancel unwind through hooked frames (their
// cleanups run); 1800 threads come and go, more than the return pool has
// chunks, so an exited thread's chunk must be reused.
TEST_P(ReturnTest, ThreadsEndingInsideHookedFrames) {
    constexpr long kEach = 600;
    attach("te_*,tc_*,tn_*,sg_leaf");
    EXPECT_EQ(command("threads " + std::to_string(kEach)), kEach) << "cancellation cleanups that ran";
    const std::string json = report();
    EXPECT_EQ(counts(json, "te_start"), (Counts{kEach, 0})) << json;
    EXPECT_EQ(counts(json, "te_exit"), (Counts{kEach, 0})) << json;
    EXPECT_EQ(counts(json, "tc_start"), (Counts{kEach, 0})) << json;
    EXPECT_EQ(counts(json, "tc_wait"), (Counts{kEach, 0})) << json;
    EXPECT_EQ(counts(json, "tn_start"), (Counts{kEach, kEach})) << json;
    EXPECT_EQ(counts(json, "sg_leaf"), (Counts{kEach, kEach})) << json;
    EXPECT_EQ(json_number(json, "unhooked_returns"), 0) << json;
}

// Each child returns through fk_fork, hooked in its parent before the fork,
// then keeps calling hooked functions; the parent's counts see none of it.
// With the trace handler, the child's returns come to its fast path
// (runtime/src/trace_fast.S), which must hand them to C: the child has no
// region.
TEST_P(ReturnTest, ForkedChildrenReturnThroughHookedFrames) {
    constexpr long kForks = 50;
    for (const std::string handler : {"count", "trace"}) {
        attach("fk_fork,sg_leaf", handler);
        EXPECT_EQ(command("fork " + std::to_string(kForks)), 0) << handler << ": children that did not exit 42";
        ASSERT_EQ(iprobe({"detach", pid_}).exit_code, 0);
    }
    const std::string json = report();
    EXPECT_EQ(counts(json, "fk_fork"), (Counts{2 * kForks, 2 * kForks})) << json;
    EXPECT_EQ(counts(json, "sg_leaf"), (Counts{0, 0})) << json;
    EXPECT_EQ(json_field(json, "fk_fork", "timed"), kForks) << "the trace handler times the parent's calls\n" << json;
}

bool tail_calls(const std::string& binary, const std::string& from, const std::string& to) {
    auto d = run({"objdump", "-d", "--no-show-raw-insn", binary});
    const std::regex body("<" + from + ">:\\n([^\\n]+\\n)*?[^\\n]*jmp +[0-9a-f]+ <" + to + ">");
    return d.exit_code == 0 && std::regex_search(d.out, body);
}

// tc_a jumps to tc_b (a sibling call): tc_b's entry finds tc_a's trampoline
// in the slot and chains on it.  2001 chained entries overflow the thread's
// return stack: counted as unhooked, and the program still computes right.
TEST_P(ReturnTest, TailCallsChainOnOneSlot) {
    const std::string binary = targets_dir() + "/" + GetParam();
    ASSERT_TRUE(tail_calls(binary, "tc_a", "tc_b")) << "the compiler no longer makes tc_a tail-call tc_b";
    constexpr long kCalls = 5000;
    const long expected = command("tailcalls " + std::to_string(kCalls));
    attach("tc_a,tc_b,tc_even,tc_odd");
    EXPECT_EQ(command("tailcalls " + std::to_string(kCalls)), expected);
    std::string json = report();
    EXPECT_EQ(counts(json, "tc_a"), (Counts{kCalls, kCalls})) << json;
    EXPECT_EQ(counts(json, "tc_b"), (Counts{kCalls, kCalls})) << json;

    constexpr long kDepth = 2000;
    EXPECT_EQ(command("mutual " + std::to_string(kDepth)), 1);
    json = report();
    const Counts even = counts(json, "tc_even"), odd = counts(json, "tc_odd");
    const long long unhooked = json_number(json, "unhooked_returns");
    EXPECT_EQ(even.calls + odd.calls, kDepth + 1) << json;
    EXPECT_GT(unhooked, 0) << json;
    EXPECT_EQ(even.completed + odd.completed + unhooked, kDepth + 1) << json;
    EXPECT_EQ(command("tailcalls 10"), command("tailcalls 10"));
    json = report();
    EXPECT_EQ(counts(json, "tc_a"), (Counts{kCalls + 20, kCalls + 20})) << "hooked again after the overflow\n" << json;
}

TEST_P(ReturnTest, RecursionDeeperThanTheReturnStackIsCountedNotFatal) {
    constexpr long kDepth = 5000;
    attach("rec");
    EXPECT_EQ(command("recurse " + std::to_string(kDepth)), kDepth);
    std::string json = report();
    const long long unhooked = json_number(json, "unhooked_returns");
    EXPECT_EQ(counts(json, "rec").calls, kDepth + 1) << json;
    EXPECT_GE(unhooked, kDepth + 1 - IPROBE_RT_RETURN_STACK_FRAMES) << json;
    EXPECT_EQ(json_number(json, "unhooked_pool_empty"), 0) << "one thread, too deep: not the pool\n" << json;
    EXPECT_EQ(counts(json, "rec").completed + unhooked, kDepth + 1) << json;
    EXPECT_EQ(command("recurse 100"), 100);
    json = report();
    EXPECT_EQ(counts(json, "rec").completed + unhooked, kDepth + 1 + 101) << json;
    EXPECT_EQ(json_number(json, "unhooked_returns"), unhooked) << json;
}

// glibc's backtrace() (libgcc's unwinder) finds the real callers: the
// trampolines' CFI gives their return addresses.
TEST_P(ReturnTest, BacktraceShowsTheRealCallers) {
    ASSERT_EQ(command("backtrace 1"), 1) << "unprobed: " << target_->output();
    attach("bt_*");
    EXPECT_EQ(command("backtrace 100"), 100) << target_->output();
    EXPECT_EQ(counts(report(), "bt_c"), (Counts{100, 100}));
}

// gdb unwinds through the trampolines with their CFI alone.
TEST_P(ReturnTest, GdbShowsTheRealCallers) {
    attach("bk_*");
    ASSERT_EQ(command("block"), 1);
    auto g = run({"gdb", "-p", pid_, "-batch", "-nx", "-ex", "thread apply all bt"}, {}, std::chrono::seconds(120));
    ASSERT_EQ(g.exit_code, 0) << g.err;
    const std::regex order("bk_c[^#]*\\n(#[0-9]+ [^\\n]*iprobe_rt_return_trampolines[^\\n]*\\n)?#[0-9]+ [^\\n]*bk_b[^#]*\\n"
                           "(#[0-9]+ [^\\n]*iprobe_rt_return_trampolines[^\\n]*\\n)?#[0-9]+ [^\\n]*bk_a");
    EXPECT_TRUE(std::regex_search(g.out, order)) << g.out;
    // iprobe's frame filter leaves the trampolines out: the callers follow each other.
    g = run({"gdb", "-p", pid_, "-batch", "-nx", "-ex", "source " + source_dir() + "/scripts/gdb/iprobe.py", "-ex",
             "thread apply all bt"},
            {}, std::chrono::seconds(120));
    ASSERT_EQ(g.exit_code, 0) << g.err;
    EXPECT_EQ(g.out.find("iprobe_rt_return_trampolines"), std::string::npos) << g.out;
    EXPECT_TRUE(std::regex_search(g.out, std::regex("bk_c[^#]*\\n#[0-9]+ [^\\n]*bk_b[^#]*\\n#[0-9]+ [^\\n]*bk_a")))
        << g.out;
    EXPECT_EQ(command("release"), 12);
}

// Detached while a thread waits inside hooked frames: the sites are NOPs
// again, the trampolines still take the frames back to their callers.
TEST_P(ReturnTest, DetachWhileFramesAreHooked) {
    const std::string exe = "/" + GetParam();
    const auto text_before = text_of(target_->pid(), exe);
    attach("bk_*", "trace");
    ASSERT_EQ(command("block"), 1);
    ASSERT_EQ(iprobe({"detach", pid_}).exit_code, 0);
    EXPECT_EQ(text_of(target_->pid(), exe), text_before) << "code differs after detach";
    EXPECT_EQ(command("release"), 12);
    const std::string json = report();
    for (const char* f : {"bk_a", "bk_b", "bk_c"}) EXPECT_EQ(counts(json, f), (Counts{1, 1})) << f << "\n" << json;
    EXPECT_EQ(command("values 10"), command("values 10")) << "the program goes on";
}

// Attached to the exit alone, then the entry too, then the exit removed:
// one site, moved between its three stubs, counting exactly all along.
TEST_P(ReturnTest, EntryAndExitSwitchedIndependently) {
    auto a = iprobe({"attach", pid_, "--functions", "rec", "--exit-only", "--handler", "count"});
    ASSERT_EQ(a.exit_code, 0) << a.err;
    EXPECT_EQ(command("recurse 9"), 9);
    a = iprobe({"attach", pid_, "--functions", "rec", "--entry-only", "--handler", "count"});
    ASSERT_EQ(a.exit_code, 0) << a.err;
    EXPECT_EQ(command("recurse 9"), 9);
    auto d = iprobe({"detach", pid_, "--functions", "rec", "--exit-only"});
    ASSERT_EQ(d.exit_code, 0) << d.err;
    EXPECT_EQ(command("recurse 9"), 9);
    const std::string json = report();
    EXPECT_EQ(counts(json, "rec"), (Counts{20, 20})) << json;
    auto t = iprobe({"attach", pid_, "--functions", "rec", "--handler", "trace"});
    EXPECT_EQ(t.exit_code, 6) << "the entry is on with count: exits with trace must wait for a detach\n" << t.out;
}

// C has no exceptions: the C++ program alone.
class CxxReturnTest : public ReturnTest {};
INSTANTIATE_TEST_SUITE_P(Cxx, CxxReturnTest, ::testing::Values("rt_cases_cxx"),
                         [](const auto&) { return std::string("Cxx"); });

TEST_P(CxxReturnTest, ExceptionsUnwindThroughHookedFrames) {
    constexpr long kThrows = 3000;
    attach("ex_*", "trace");
    EXPECT_EQ(command("exceptions " + std::to_string(kThrows)), kThrows) << "every throw caught, every destructor run";
    EXPECT_EQ(command("rethrow 1000"), 1000);
    EXPECT_EQ(command("nested 500"), 1500);
    const std::string json = report();
    EXPECT_EQ(counts(json, "ex_outer"), (Counts{kThrows + 500, kThrows + 500})) << json;
    EXPECT_EQ(counts(json, "ex_middle"), (Counts{kThrows + 500, 0})) << json;
    EXPECT_EQ(counts(json, "ex_rethrow_outer"), (Counts{1500, 1500})) << json;
    EXPECT_EQ(counts(json, "ex_rethrow_mid"), (Counts{1500, 0})) << json;
    EXPECT_EQ(counts(json, "ex_nested"), (Counts{500, 500})) << json;
    EXPECT_EQ(counts(json, "ex_capture"), (Counts{500, 500})) << json;
    EXPECT_EQ(counts(json, "ex_inner"), (Counts{kThrows + 1000 + 4 * 500, 0})) << json;
    EXPECT_EQ(json_number(json, "unhooked_returns"), 0) << json;
}

}  // namespace
}  // namespace iprobe::test
