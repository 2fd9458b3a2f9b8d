// `iprobe attach --args --retval --backtrace` end to end: values_target
// (targets/values_target.c) built -O2 -g as C and C++ in the entry flow, as
// C in the LLVM flow, without -g, and as C and C++ in the -finstrument-functions flow.
// Every value is checked exactly, in `trace --format json` and text.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <thread>
#include <regex>

#include <gtest/gtest.h>

#include "hotpatch_fixture.h"
#include "iprobe/hotpatch/trace_file.h"

namespace iprobe::test {
namespace {

std::string entry_of(const std::string& function) {
    return "\"kind\":\"entry\",\"function\":\"" + function + "\"";
}
std::string exit_of(const std::string& function) { return "\"kind\":\"exit\",\"function\":\"" + function + "\""; }
std::string arg(const std::string& name, const std::string& type, const std::string& value) {
    return "{\"name\":\"" + name + "\",\"type\":\"" + type + "\",\"value\":" + value + "}";
}
std::string retval(const std::string& type, const std::string& value) {
    return "\"retval\":{\"type\":\"" + type + "\",\"value\":" + value + "}";
}

// bt_inner(3)'s entry names bt_middle, bt_outer and main, with their lines.
void expect_three_callers(const std::string& t) {
    const auto inner = lines_with(t, {entry_of("bt_inner"), arg("x", "int", "3"), "\"backtrace\":["});
    ASSERT_EQ(inner.size(), 1u) << t;
    const std::regex frames(
        "\"backtrace\":\\[\\{\"address\":\"0x[0-9a-f]+\",\"function\":\"bt_middle\",\"file\":\"[^\"]*values_target.c\","
        "\"line\":[0-9]+\\},\\{\"address\":\"0x[0-9a-f]+\",\"function\":\"bt_outer\",\"file\":\"[^\"]*values_target.c\","
        "\"line\":[0-9]+\\},\\{\"address\":\"0x[0-9a-f]+\",\"function\":\"main\"[^}]*\\}\\]");
    EXPECT_TRUE(std::regex_search(inner[0], frames)) << inner[0];
}

class ValuesTest : public ::testing::Test {
protected:
    void SetUp() override {
        if (!is_root()) GTEST_SKIP() << "needs root (ptrace of any process, /run/iprobe)";
    }
    // Starts targets/values_target built as `name`; false when it was not built.
    bool start(const std::string& name) {
        name_ = name;
        binary_ = targets_dir() + "/" + name;
        if (!std::filesystem::exists(binary_)) return false;
        target_ = std::make_unique<HpTarget>(1, binary_);
        pid_ = std::to_string(target_->pid());
        return true;
    }
    void attach(std::vector<std::string> options) {
        std::vector<std::string> argv{"attach", pid_};
        argv.insert(argv.end(), options.begin(), options.end());
        auto a = iprobe(argv);
        ASSERT_EQ(a.exit_code, 0) << a.out << a.err;
        attach_out_ = a.out;
    }
    std::string trace(const std::string& format) {
        auto t = iprobe({"trace", pid_, "--format", format, "--duration", "0"});
        EXPECT_EQ(t.exit_code, 0) << t.err;
        return t.out;
    }
    // `command` run, traced live to a file with `trace --output FILE --format
    // F` (the live stream, printed as the file is written), then the file
    // converted back with `trace --input FILE --format F`: byte for byte the
    // same, for every format.  Returns the JSON.
    std::string file_is_live(const std::string& command) {
        TempDir dir;
        std::string json;
        for (const std::string format : {"json", "text", "chrome"}) {
            SCOPED_TRACE(format);
            target_->command(command);
            const std::string file = dir / (format + ".trace");
            auto live = iprobe({"trace", pid_, "--duration", "0", "--output", file, "--format", format});
            EXPECT_EQ(live.exit_code, 0) << live.err;
            EXPECT_EQ(live.err.find("keeps no values"), std::string::npos) << live.err;
            EXPECT_NE(live.err.find(" with values, "), std::string::npos) << live.err;
            auto converted = iprobe({"trace", "--input", file, "--format", format});
            EXPECT_EQ(converted.exit_code, 0) << converted.err;
            EXPECT_NE(live.out.find(format == "text" ? "=" : "\"args\""), std::string::npos) << "values printed\n" << live.out;
            EXPECT_EQ(converted.out, live.out);
            if (format == "json") json = converted.out;
        }
        return json;
    }
    bool cxx() const { return name_.find("cxx") != std::string::npos; }
    // A second call of v_wait (values_target.c), blocked and released at once.
    void wait_once_more() {
        ASSERT_EQ(target_->command("block 4"), 1);
        EXPECT_EQ(target_->command("release"), 9);
    }
    // v_wait's calls and completed calls in `report --json`.
    void expect_wait_counts(long long calls, long long completed) {
        const std::string r = iprobe({"report", pid_, "--json"}).out;
        EXPECT_EQ(json_calls(r, "v_wait"), calls) << r;
        EXPECT_EQ(json_completed(r, "v_wait"), completed) << r;
    }
    // The values of run_values() (values_target.c) in trace `t`, each
    // exactly once; `b`, `flag_*` and `k` as JSON values (where a flow has
    // them <optimized out>).
    void expect_every_kind(const std::string& t, const std::string& b, const std::string& flag_green,
                           const std::string& flag_blue, const std::string& k) {
        auto one = [&](const std::vector<std::string>& fragments) {
            EXPECT_EQ(lines_with(t, fragments).size(), 1u) << ::testing::PrintToString(fragments) << "\n" << t;
        };
        // integers of every size and signedness (a signed char is a char to the ABI)
        one({entry_of("v_ints"), "\"args\":[" + arg("a", "int", "7") + "," + arg("b", "unsigned short", b) + "," +
                                     arg("c", "long", "-9") + "," + arg("d", "char", "10") + "]"});
        one({exit_of("v_ints"), retval("long", "16")});
        // enums by name, bool
        one({entry_of("v_enum"), "\"args\":[" + arg("c", "enum color", "\"GREEN\"") + "," + arg("flag", "bool", flag_green) + "]"});
        one({entry_of("v_enum"), "\"args\":[" + arg("c", "enum color", "\"BLUE\"") + "," + arg("flag", "bool", flag_blue) + "]"});
        one({exit_of("v_enum"), retval("int", "10")});
        one({exit_of("v_enum"), retval("int", "-3")});
        // strings: a real one, NULL, a dangling pointer (unmapped: no crash), one ending at an unmapped page
        one({entry_of("v_string"), arg("s", "const char*", "\"user:42\"")});
        one({entry_of("v_string"), arg("s", "const char*", "null")});
        EXPECT_EQ(lines_with(t, {entry_of("v_string"), "{\"name\":\"s\",\"type\":\"const char*\",\"value\":\"<unreadable 0x"}).size(), 1u) << t;
        one({entry_of("v_string"), arg("s", "const char*", "\"edge\"")});
        one({exit_of("v_string"), retval("long", "7")});
        one({exit_of("v_string"), retval("long", "4")});
        EXPECT_EQ(lines_with(t, {exit_of("v_string"), retval("long", "-1")}).size(), 2u) << t;
        // floating point from the vector registers
        one({entry_of("v_double"), "\"args\":[" + arg("x", "double", "1.5") + "," + arg("y", "float", "0.25") + "," +
                                       arg("n", "int", "4") + "]"});
        one({exit_of("v_double"), retval("double", "6.25")});
        // small structs by value: INTEGER, SSE+SSE, INTEGER+SSE
        one({entry_of("v_point"), arg("p", "struct point", "{\"x\":3,\"y\":4}")});
        one({exit_of("v_point"), retval("long", "304")});
        one({entry_of("v_vec"), arg("v", "struct vec2", "{\"x\":1.25,\"y\":2.5}")});
        one({exit_of("v_vec"), retval("double", "3.75")});
        one({entry_of("v_mixed"), "\"args\":[" + arg("m", "struct mixed", "{\"id\":11,\"weight\":2.75}") + "," +
                                      arg("k", "int", k) + "]"});
        one({exit_of("v_mixed"), retval("long", "35")});
        one({entry_of("v_raw"), arg("a", "long", "1229782938247303441") + "," + arg("b", "long", "8738") + "," +
                                    arg("c", "long", "-3") + "," + arg("d", "long", "9223372036854775807") + "," +
                                    arg("e", "long", "5") + "," + arg("f", "long", "25769803776")});
        // void: an exit without a value
        one({entry_of("v_void"), arg("n", "int", "9")});
        const auto void_exit = lines_with(t, {exit_of("v_void")});
        ASSERT_EQ(void_exit.size(), 1u) << t;
        EXPECT_EQ(void_exit[0].find("retval"), std::string::npos) << void_exit[0];
        if (cxx()) {
            // `this` is the object's address, as the program printed it
            std::smatch m;
            const std::string out = target_->output();
            ASSERT_TRUE(std::regex_search(out, m, std::regex("this (0x[0-9a-f]+)"))) << out;
            one({entry_of("Counter::add(long)"), "{\"name\":\"this\",\"type\":\"const struct Counter*\",\"value\":\"" +
                                                     m[1].str() + "\"}," + arg("v", "long", "2")});
            one({exit_of("Counter::add(long)"), retval("long", "42")});
    }
    }

    std::string name_, binary_, pid_, attach_out_;
    std::unique_ptr<HpTarget> target_;
};

class TypedValuesTest : public ValuesTest, public ::testing::WithParamInterface<std::string> {
protected:
    void SetUp() override {
        ValuesTest::SetUp();
        if (IsSkipped()) return;
        if (!start(GetParam())) GTEST_SKIP() << GetParam() << " not built (no LLVM 14 pass)";
    }
};

TEST_P(TypedValuesTest, ArgumentsAndReturnValuesOfEveryKindAreExact) {
    attach({"--args", "--retval", "--functions", "v_*,Counter*"});
    EXPECT_EQ(attach_out_.find("without DWARF"), std::string::npos) << attach_out_;
    target_->command("values");
    const std::string t = trace("json");
    expect_every_kind(t, "8", "true", "false", "3");
}

TEST_P(TypedValuesTest, TextPrintsCallsWithValuesNestedPerThread) {
    attach({"--args", "--retval", "--functions", "fib,v_string"});
    EXPECT_EQ(target_->command("fib 10"), 55);
    target_->command("values");
    const std::string t = trace("text");
    EXPECT_EQ(lines_with(t, {" -> fib(n=10)"}).size(), 1u) << t;
    EXPECT_EQ(lines_with(t, {" <- fib(n=10) = 55"}).size(), 1u) << t;
    EXPECT_EQ(lines_with(t, {"   -> fib(n=9)"}).size(), 1u) << "nested one level under fib(10)\n" << t;
    EXPECT_EQ(lines_with(t, {" <- v_string(s=\"user:42\", read_it=1) = 7"}).size(), 1u) << t;
    EXPECT_EQ(lines_with(t, {" <- v_string(s=NULL, read_it=1) = -1"}).size(), 1u) << t;
    // `calls` stays exact
    auto r = iprobe({"report", pid_, "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(json_calls(r.out, "v_string"), 4) << r.out;
}

// Arguments of the entries alone (--entry-only --args): each call of the
// recursion is an entry that opens no call (its exit is not traced), so
// every call of fib(10) sits at the thread's depth 0, live and in the file
// alike, and none has an exit.
TEST_P(TypedValuesTest, EntryOnlyArgumentsOpenNoCall) {
    attach({"--args", "--entry-only", "--functions", "fib"});
    const std::string json = file_is_live("fib 10");
    // file_is_live ran it once a format, three times
    const long long calls = json_calls(iprobe({"report", pid_, "--json"}).out, "fib") / 3;
    EXPECT_GT(calls, 10);
    EXPECT_EQ(lines_with(json, {entry_of("fib"), "\"depth\":0,\"exit_traced\":false,\"args\":[{\"name\":\"n\""}).size(),
              static_cast<std::size_t>(calls))
        << json;
    EXPECT_EQ(lines_with(json, {"\"function\":\"fib\""}).size(), static_cast<std::size_t>(calls)) << json;
    EXPECT_EQ(lines_with(json, {"\"ph\":\"B\""}).size(), 0u);
    EXPECT_EQ(lines_with(json, {entry_of("fib"), "\"args\":[" + arg("n", "int", "10") + "]"}).size(), 1u) << json;
    EXPECT_EQ(lines_with(json, {entry_of("fib"), "\"args\":[" + arg("n", "int", "9") + "]"}).size(), 1u) << json;
    target_->command("fib 3");
    const std::string text = trace("text");
    EXPECT_EQ(lines_with(text, {" -> fib(n=3)"}).size(), 1u) << text;
    EXPECT_EQ(lines_with(text, {"   -> fib"}).size(), 0u) << "nothing nested\n" << text;
    EXPECT_EQ(lines_with(text, {"<- fib"}).size(), 0u) << text;
}

TEST_P(TypedValuesTest, BacktraceNamesTheCallersWithTheirLines) {
    attach({"--args", "--backtrace=3", "--functions", "bt_*"});
    EXPECT_EQ(target_->command("bt 1"), 11);
    const std::string t = trace("json");
    expect_three_callers(t);
    // depth bounded: bt_outer's own callers are main and what called main
    const auto outer = lines_with(t, {entry_of("bt_outer"), "\"backtrace\":[{\"address\""});
    ASSERT_EQ(outer.size(), 1u) << t;
    EXPECT_NE(outer[0].find("\"function\":\"main\""), std::string::npos) << outer[0];
}

// C++ in the entry flow and in the -finstrument-functions flow, where the
// cleanups' exit hooks (in the function's cold part) record nothing more.
class ExceptionValuesTest : public ValuesTest, public ::testing::WithParamInterface<std::string> {};

TEST_P(ExceptionValuesTest, UnwoundPastAFunctionLeavesItWithoutAValue) {
    ASSERT_TRUE(start(GetParam()));
    attach({"--args", "--retval", "--functions", "ex_*"});
    EXPECT_EQ(target_->command("throw 1"), -100);
    EXPECT_EQ(target_->command("throw 0"), 1);
    const std::string t = trace("json");
    EXPECT_EQ(lines_with(t, {exit_of("ex_thrower"), "\"unwound\":true"}).size(), 1u) << t;
    EXPECT_EQ(lines_with(t, {exit_of("ex_middle"), "\"unwound\":true"}).size(), 1u) << t;
    EXPECT_EQ(lines_with(t, {exit_of("ex_catcher"), retval("long", "-100")}).size(), 1u) << t;
    EXPECT_EQ(lines_with(t, {exit_of("ex_thrower"), retval("long", "0")}).size(), 1u) << t;
    EXPECT_EQ(lines_with(t, {exit_of("ex_catcher"), retval("long", "1")}).size(), 1u) << t;
    EXPECT_EQ(lines_with(t, {"\"unwound\":true"}).size(), 2u) << t;
    EXPECT_EQ(lines_with(t, {"\"kind\":\"exit\""}).size(), 6u) << "one exit a call\n" << t;
}

INSTANTIATE_TEST_SUITE_P(Flows, ExceptionValuesTest, ::testing::Values("values_cxx", "values_finstrument_cxx"));

INSTANTIATE_TEST_SUITE_P(Flows, TypedValuesTest, ::testing::Values("values_c", "values_cxx", "values_llvm"));

TEST_F(ValuesTest, WithoutDebugInfoRawArgumentsAreTheConstantsPassed) {
    ASSERT_TRUE(start("values_nodebug"));
    attach({"--args", "--retval", "--functions", "v_raw"});
    EXPECT_NE(attach_out_.find("1 function(s) without DWARF"), std::string::npos) << attach_out_;
    target_->command("values");
    const std::string t = trace("json");
    const std::string u64 = "uint64_t";
    EXPECT_EQ(lines_with(t, {entry_of("v_raw"), "\"args\":[" + arg("arg0", u64, "1229782938247303441") + "," +
                                                    arg("arg1", u64, "8738") + "," + arg("arg2", u64, "18446744073709551613") +
                                                    "," + arg("arg3", u64, "9223372036854775807") + "," +
                                                    arg("arg4", u64, "5") + "," + arg("arg5", u64, "25769803776") + "]"})
                  .size(),
              1u)
        << t;
    // 0x1111111111111111 ^ 0x2222 ^ -3 ^ INT64_MAX ^ 5 ^ 0x600000000
    const long long expected = 0x1111111111111111LL ^ 0x2222 ^ -3 ^ 0x7fffffffffffffffLL ^ 5 ^ 0x600000000LL;
    EXPECT_EQ(lines_with(t, {exit_of("v_raw"), retval(u64, std::to_string(static_cast<unsigned long long>(expected)))}).size(), 1u)
        << t;
}

// The -finstrument-functions flow: the site is the hook's call after the
// prologue, so the values come from each parameter's DWARF location there
// (values_plan.h's recipe) and the return through a hook of the return slot
// at CFA-8.  What gcc 12 -O2 leaves nowhere readable at the site (an entry
// value: b, flag, k) is shown as <optimized out>, counted and said.
class FinstrumentValuesTest : public ValuesTest, public ::testing::WithParamInterface<std::string> {
protected:
    // values_target.c's inlined in_visit, as the probe list names it
    std::string visit() const { return cxx() ? "in_visit(int, item*, char const*, int)" : "in_visit"; }
    std::string visit_pattern() const { return cxx() ? "in_visit\\(int, item\\*, char const\\*, int\\)" : "in_visit"; }
    // in_visit's first three arguments in call n of a walk of g_items (where
    // the list starts, as the target printed it), `name` its string.
    std::string visit_args(int n, const std::string& name) const {
        std::smatch m;
        const std::string out = target_->output();
        if (!std::regex_search(out, m, std::regex("items (0x[0-9a-f]+)"))) return "(no 'items' in the output)";
        char it[32];
        std::snprintf(it, sizeof it, "\"0x%llx\"", std::stoull(m[1].str(), nullptr, 16) + 16ull * n);
        return "\"args\":[" + arg("n", "int", std::to_string(n)) + "," + arg("it", "struct item*", it) + "," +
               arg("name", "const char*", "\"" + name + "\"");
    }
    void SetUp() override {
        ValuesTest::SetUp();
        if (IsSkipped()) return;
        ASSERT_TRUE(start(GetParam())) << GetParam() << " not built";
    }
    // `rounds` attaches of v_spin (what "spin N"'s threads call), each
    // detached 20 ms later: the calls in flight the detaches said they lost.
    long long attach_and_detach_spinning(int rounds) {
        long long said = 0;
        for (int round = 0; round < rounds; round++) {
            attach({"--functions", "v_spin"});
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
            const auto d = iprobe({"detach", pid_, "--json"});
            EXPECT_EQ(d.exit_code, 0) << d.err;
            said += json_number(d.out, "exits_lost");
        }
        return said;
    }
};

TEST_P(FinstrumentValuesTest, ArgumentsAndReturnValuesComeFromTheSiteRecipe) {
    auto a = iprobe({"attach", pid_, "--args", "--retval", "--functions", "v_*,Counter*", "--json"});
    ASSERT_EQ(a.exit_code, 0) << a.out << a.err;
    EXPECT_EQ(json_number(a.out, "values_optimized_out"), 3) << a.out;
    EXPECT_EQ(json_number(a.out, "values_unavailable"), 0) << a.out;
    target_->command("values");
    const std::string t = trace("json");
    const std::string out = "\"<optimized out>\"";
    expect_every_kind(t, out, out, out, out);
    const long long raw = 0x1111111111111111LL ^ 0x2222 ^ -3 ^ 0x7fffffffffffffffLL ^ 5 ^ 0x600000000LL;
    EXPECT_EQ(lines_with(t, {exit_of("v_raw"), retval("long", std::to_string(raw))}).size(), 1u) << t;
    // every entry has exactly one exit
    EXPECT_EQ(lines_with(t, {"\"kind\":\"entry\""}).size(), lines_with(t, {"\"kind\":\"exit\""}).size()) << t;
}

TEST_P(FinstrumentValuesTest, WhenOnAParameterRecordsExactlyTheMatchingCalls) {
    attach({"--args", "--retval", "--when", "n == 10", "--functions", "fib"});
    EXPECT_EQ(target_->command("fib 12"), 144);
    EXPECT_EQ(target_->command("fib 12"), 144);
    const std::string t = trace("text");
    // fib(12) calls fib(10) twice (from fib(12) and fib(11)): 4 in two runs
    EXPECT_EQ(lines_with(t, {" -> fib(n=10)"}).size(), 4u) << t;
    EXPECT_EQ(lines_with(t, {" <- fib(n=10) = 55"}).size(), 4u) << t;
    EXPECT_EQ(lines_with(t, {"fib(n=9)"}).size(), 0u) << t;
    auto r = iprobe({"report", pid_, "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(json_calls(r.out, "fib"), 2 * 465) << r.out;  // fib(12) is 465 calls
    EXPECT_NE(r.out.find("\"matched\":4"), std::string::npos) << r.out;
}

// Decided at exit: the hooked return has the value and the duration.
TEST_P(FinstrumentValuesTest, WhenOnTheReturnValueRecordsExactlyTheMatchingCalls) {
    attach({"--args", "--retval", "--when", "retval == 55 && duration > 1ns", "--functions", "fib"});
    EXPECT_EQ(target_->command("fib 12"), 144);
    const std::string t = trace("text");
    EXPECT_EQ(lines_with(t, {" -> fib(n=10)"}).size(), 2u) << t;
    EXPECT_EQ(lines_with(t, {" <- fib(n=10) = 55"}).size(), 2u) << t;
    EXPECT_EQ(lines_with(t, {"fib(n=9)"}).size(), 0u) << t;
    auto r = iprobe({"report", pid_, "--json"});
    EXPECT_EQ(json_calls(r.out, "fib"), 465) << r.out;
    EXPECT_NE(r.out.find("\"matched\":2"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("\"undecided\":0"), std::string::npos) << r.out;
}

// Timed through the hooked return, every call in both histograms.
TEST_P(FinstrumentValuesTest, HistogramBucketsAddUpToTheCalls) {
    attach({"--retval", "--functions", "fib"});
    EXPECT_EQ(target_->command("fib 12"), 144);
    const auto r = iprobe({"report", pid_, "--hist"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("fib: latency of 465 timed calls"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("fib: return value of 465 calls"), std::string::npos) << r.out;
}

TEST_P(FinstrumentValuesTest, WhenOnAnOptimizedOutParameterIsRefused) {
    auto a = iprobe({"attach", pid_, "--when", "flag", "--functions", "v_enum"});
    EXPECT_EQ(a.exit_code, 3) << a.out << a.err;
    EXPECT_NE(a.err.find("'flag' is optimized out at the -finstrument-functions site"), std::string::npos) << a.err;
    auto s = iprobe({"status", pid_, "--json"});
    EXPECT_EQ(s.out.find("\"v_enum\""), std::string::npos) << "nothing enabled\n" << s.out;
}

TEST_P(FinstrumentValuesTest, BacktraceNamesTheCallersWithTheirLines) {
    attach({"--args", "--backtrace=3", "--functions", "bt_*"});
    EXPECT_EQ(target_->command("bt 1"), 11);
    expect_three_callers(trace("json"));
}

// A call in flight (v_wait, blocked inside) while iprobe attaches again or
// detaches.  With values its entry writes the return trampoline into its
// return slot, and its exit hooks leave the exit to it; without values the
// exit hooks record it.  However the two interleave with the call, it has
// exactly one exit, `completed` is exact and the program's answers are
// what they were without iprobe.
TEST_P(FinstrumentValuesTest, AttachAgainWithoutValuesWhileACallIsInFlightGivesItOneExit) {
    ASSERT_TRUE(start(GetParam()));
    const long plain = target_->command("values");
    attach({"--args", "--retval", "--functions", "v_wait"});
    ASSERT_EQ(target_->command("block 3"), 1);
    attach({"--functions", "v_wait"});
    EXPECT_EQ(target_->command("release"), 8);
    wait_once_more();
    const std::string t = trace("json");
    EXPECT_EQ(lines_with(t, {entry_of("v_wait")}).size(), 2u) << t;
    EXPECT_EQ(lines_with(t, {entry_of("v_wait"), "\"args\":[" + arg("n", "int", "3") + "]"}).size(), 1u) << t;
    EXPECT_EQ(lines_with(t, {exit_of("v_wait")}).size(), 2u) << t;
    // the call in flight: its hooked return recorded it, as the attach in
    // force at its exit asks (no --retval)
    EXPECT_EQ(t.find("\"retval\""), std::string::npos) << t;
    EXPECT_EQ(t.find("\"unwound\":true"), std::string::npos) << t;
    expect_wait_counts(2, 2);
    EXPECT_EQ(target_->command("values"), plain);
}

// The exit hooks stay checked while the hooked call is in flight, and go
// back to the plain trace exit at the first attach after it returned: the
// calls before and after each have one exit.
TEST_P(FinstrumentValuesTest, ExitHooksArePlainAgainOnceNoHookedCallIsInFlight) {
    ASSERT_TRUE(start(GetParam()));
    attach({"--args", "--retval", "--functions", "v_wait"});
    ASSERT_EQ(target_->command("block 3"), 1);
    attach({"--functions", "v_wait"});
    EXPECT_EQ(target_->command("release"), 8);
    attach({"--functions", "v_wait"});
    wait_once_more();
    attach({"--args", "--retval", "--functions", "v_wait"});
    wait_once_more();
    attach({"--functions", "v_wait"});
    wait_once_more();
    const std::string t = trace("json");
    EXPECT_EQ(lines_with(t, {entry_of("v_wait")}).size(), 4u) << t;
    EXPECT_EQ(lines_with(t, {exit_of("v_wait")}).size(), 4u) << t;
    EXPECT_EQ(lines_with(t, {exit_of("v_wait"), retval("long", "9")}).size(), 1u) << t;
    expect_wait_counts(4, 4);
}

TEST_P(FinstrumentValuesTest, AttachWithValuesWhileAPlainCallIsInFlightKeepsItsExit) {
    ASSERT_TRUE(start(GetParam()));
    const long plain = target_->command("values");
    attach({"--functions", "v_wait"});
    ASSERT_EQ(target_->command("block 3"), 1);
    attach({"--args", "--retval", "--functions", "v_wait"});
    EXPECT_EQ(target_->command("release"), 8);
    wait_once_more();
    const std::string t = trace("json");
    EXPECT_EQ(lines_with(t, {entry_of("v_wait")}).size(), 2u) << t;
    EXPECT_EQ(lines_with(t, {entry_of("v_wait"), "\"args\":[" + arg("n", "int", "4") + "]"}).size(), 1u) << t;
    // the call in flight entered without values: its exit hook records it
    EXPECT_EQ(lines_with(t, {exit_of("v_wait")}).size(), 2u) << t;
    EXPECT_EQ(lines_with(t, {exit_of("v_wait"), "\"retval\""}).size(), 1u) << t;
    EXPECT_EQ(lines_with(t, {exit_of("v_wait"), retval("long", "9")}).size(), 1u) << t;
    expect_wait_counts(2, 2);
    EXPECT_EQ(target_->command("values"), plain);
}

TEST_P(FinstrumentValuesTest, AttachTheCountHandlerWhileACallWithValuesIsInFlightCountsItOnce) {
    ASSERT_TRUE(start(GetParam()));
    attach({"--args", "--retval", "--functions", "v_wait"});
    ASSERT_EQ(target_->command("block 3"), 1);
    attach({"--handler", "count", "--completed", "--functions", "v_wait"});
    EXPECT_EQ(target_->command("release"), 8);
    wait_once_more();
    expect_wait_counts(2, 2);
}

// Detached while the call's return slot holds its trampoline: the exit
// hooks are NOPs again and the code is as it was; the trampoline takes the
// call back to its caller and records its exit.
TEST_P(FinstrumentValuesTest, DetachWhileACallWithValuesIsInFlight) {
    ASSERT_TRUE(start(GetParam()));
    const long plain = target_->command("values");
    const std::string exe = "/" + GetParam();
    const auto text_before = text_of(target_->pid(), exe);
    attach({"--args", "--retval", "--functions", "v_wait"});
    ASSERT_EQ(target_->command("block 3"), 1);
    const auto d = iprobe({"detach", pid_, "--json"});
    ASSERT_EQ(d.exit_code, 0) << d.err;
    EXPECT_EQ(json_number(d.out, "exits_lost"), 0) << "its trampoline records it\n" << d.out;
    EXPECT_EQ(text_of(target_->pid(), exe), text_before) << "code differs after detach";
    EXPECT_EQ(target_->command("release"), 8);
    expect_wait_counts(1, 1);
    EXPECT_EQ(json_number(iprobe({"report", pid_, "--json"}).out, "exits_lost_at_detach"), 0);
    EXPECT_EQ(target_->command("values"), plain);
}

// Without values no trampoline holds the call: in this flow its exit is
// the exit hook's, a NOP again after detach, so a call in flight then has
// no exit (the known limit, docs/hotpatch.md): calls stays one more than
// completed, and the program goes on unharmed.  Never silently: detach
// counts the call from its timed frame and says so, and report keeps it.
TEST_P(FinstrumentValuesTest, DetachWhileAPlainCallIsInFlightLeavesItWithoutAnExit) {
    ASSERT_TRUE(start(GetParam()));
    const long plain = target_->command("values");
    attach({"--functions", "v_wait"});
    ASSERT_EQ(target_->command("block 3"), 1);
    const auto d = iprobe({"detach", pid_, "--json"});
    ASSERT_EQ(d.exit_code, 0) << d.err;
    EXPECT_EQ(json_number(d.out, "exits_lost"), 1) << d.out;
    EXPECT_EQ(target_->command("release"), 8);
    // its thread ended without another event: trace cannot place the mark there, and says so
    const auto t = iprobe({"trace", pid_, "--duration", "0"});
    EXPECT_EQ(lines_with(t.out, {"-> v_wait"}).size(), 1u) << t.out;
    EXPECT_NE(t.err.find("iprobe: 1 calls in flight lost their exit at a detach, their threads with no event after it"),
              std::string::npos)
        << t.err;
    expect_wait_counts(1, 0);
    const auto r = iprobe({"report", pid_, "--json"});
    EXPECT_EQ(json_number(r.out, "exits_lost_at_detach"), 1) << r.out;
    const auto text = iprobe({"report", pid_});
    EXPECT_NE(text.out.find("exits lost at detach: 1 calls"), std::string::npos) << text.out;
    EXPECT_EQ(target_->command("values"), plain);
}

// The lines of a text trace without their time and thread columns.
std::vector<std::string> text_events(const std::string& text) {
    static const std::regex head("^[0-9]+\\.[0-9]{9} +[0-9]+ ");
    std::vector<std::string> out;
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);) out.push_back(std::regex_replace(line, head, ""));
    return out;
}

// ... and the stream says so where it happened: the thread's next event
// (after the next attach) comes after one mark of that call, and nests at
// depth 0, not inside a call that will never end.  The same in the live
// trace, in the file written of it and in the file converted later; in
// Chrome's format the call's span ends at the detach, so every B has its E;
// folded stacks do not put the later calls under it.
TEST_P(FinstrumentValuesTest, ACallThatLostItsExitAtADetachIsClosedWhereItHappened) {
    TempDir dir;
    for (const std::string format : {"text", "json", "chrome", "folded"}) {
        SCOPED_TRACE(format);
        attach({"--functions", "v_wait,v_spin"});
        ASSERT_EQ(target_->command("hold 3"), 1);
        const auto d = iprobe({"detach", pid_, "--json"});
        ASSERT_EQ(d.exit_code, 0) << d.err;
        EXPECT_EQ(json_number(d.out, "exits_lost"), 1) << d.out;
        EXPECT_EQ(target_->command("unblock"), 8);  // returns while detached: no exit recorded
        attach({"--functions", "v_wait,v_spin"});
        EXPECT_EQ(target_->command("go"), 3);
        if (format == "folded") {
            const auto folded = iprobe({"report", pid_, "--folded", "--duration", "0"});
            ASSERT_EQ(folded.exit_code, 0) << folded.err;
            EXPECT_EQ(lines_with(folded.out, {"v_spin "}).size(), 1u) << folded.out;
            EXPECT_EQ(folded.out.find("v_wait"), std::string::npos) << folded.out;
            ASSERT_EQ(iprobe({"detach", pid_}).exit_code, 0);
            continue;
        }
        const std::string file = dir / (format + ".trace");
        const auto live = iprobe({"trace", pid_, "--duration", "0", "--output", file, "--format", format});
        ASSERT_EQ(live.exit_code, 0) << live.err;
        const auto converted = iprobe({"trace", "--input", file, "--format", format});
        ASSERT_EQ(converted.exit_code, 0) << converted.err;
        EXPECT_EQ(converted.out, live.out);
        EXPECT_EQ(live.err.find("lost their exit"), std::string::npos) << "every mark placed\n" << live.err;
        const std::string& t = live.out;
        if (format == "text") {
            const std::vector<std::string> want = {
                "-> v_wait", "-- 1 calls in flight lost their exit at a detach --",
                "-> v_spin", "<- v_spin", "-> v_spin", "<- v_spin", "-> v_spin", "<- v_spin"};
            EXPECT_EQ(text_events(t), want) << t;
        } else if (format == "json") {
            EXPECT_EQ(lines_with(t, {"exits_lost_before"}).size(), 1u) << t;
            EXPECT_EQ(lines_with(t, {"\"kind\":\"entry\",\"function\":\"v_spin\",\"depth\":0", "\"exits_lost_before\":1"})
                          .size(),
                      1u)
                << t;
            EXPECT_EQ(lines_with(t, {"\"depth\":0"}).size(), 7u) << "everything at depth 0\n" << t;
        } else {
            EXPECT_EQ(lines_with(t, {"\"ph\":\"B\""}).size(), 4u) << t;
            EXPECT_EQ(lines_with(t, {"\"ph\":\"E\""}).size(), 4u) << t;
            EXPECT_EQ(lines_with(t, {"\"name\":\"v_wait\",\"ph\":\"E\"", "\"exit_lost_at_detach\":true"}).size(), 1u) << t;
            EXPECT_EQ(lines_with(t, {"\"name\":\"v_spin\",\"ph\":\"B\"", "\"exits_lost_before\":1"}).size(), 1u) << t;
        }
        ASSERT_EQ(iprobe({"detach", pid_}).exit_code, 0);
    }
}

// ... and attached again without values before the call returns: its exit
// hooks record calls again, but not this one, which its trampoline records.
TEST_P(FinstrumentValuesTest, DetachAndAttachAgainWhileACallWithValuesIsInFlightGivesItOneExit) {
    ASSERT_TRUE(start(GetParam()));
    const long plain = target_->command("values");
    attach({"--args", "--retval", "--functions", "v_wait"});
    ASSERT_EQ(target_->command("block 3"), 1);
    ASSERT_EQ(iprobe({"detach", pid_}).exit_code, 0);
    attach({"--functions", "v_wait"});
    EXPECT_EQ(target_->command("release"), 8);
    wait_once_more();
    const std::string t = trace("json");
    EXPECT_EQ(lines_with(t, {exit_of("v_wait")}).size(), lines_with(t, {entry_of("v_wait")}).size()) << t;
    EXPECT_EQ(lines_with(t, {exit_of("v_wait")}).size(), 2u) << t;
    EXPECT_EQ(t.find("\"unwound\":true"), std::string::npos) << t;
    expect_wait_counts(2, 2);
    EXPECT_EQ(target_->command("values"), plain);
}

// Two threads call v_spin as fast as they can while iprobe attaches with
// values, with a --when, and without, over and over: every call entered has
// exactly one exit (completed == calls == the calls the program made), the
// program never crashes.
TEST_P(FinstrumentValuesTest, EveryCallHasOneExitWhileAttachesSwitchValuesUnderLoad) {
    ASSERT_TRUE(start(GetParam()));
    attach({"--functions", "v_spin"});
    ASSERT_EQ(target_->command("spin 2"), 2);
    for (int round = 0; round < 6; round++) {
        attach({"--args", "--retval", "--functions", "v_spin"});
        attach({"--functions", "v_spin"});
        attach({"--args", "--when", "i == 3", "--functions", "v_spin"});
    }
    const long made = target_->command("stop");
    ASSERT_GT(made, 0);
    const std::string r = iprobe({"report", pid_, "--json"}).out;
    EXPECT_EQ(json_calls(r, "v_spin"), made) << r;
    EXPECT_EQ(json_completed(r, "v_spin"), made) << r;
    EXPECT_EQ(json_number(r, "unhooked_returns"), 0) << r;
    EXPECT_EQ(json_number(r, "unmatched_exits"), 0) << r;
}

// Two threads call v_spin as fast as they can while iprobe attaches and
// detaches (plain trace, no values) over and over: every call entered while
// attached either exits (an exit whose entry came before an attach is
// unmatched) or is one whose exit was counted lost: by a detach, from the
// timed frames in its stop, or by the runtime, for a thread inside the entry
// hook's handler then, which finds the probe off after it.  Both are in
// report's exits_lost_at_detach.  What is left unseen is a thread stopped
// within a few instructions of the handler (between its checks and its
// frame push or pop): at most a couple of calls over these 8 rounds, where
// without the count every call in flight at each detach went unsaid.
TEST_P(FinstrumentValuesTest, EveryCallInFlightAtADetachIsCountedUnderLoad) {
    ASSERT_TRUE(start(GetParam()));
    ASSERT_EQ(target_->command("spin 2"), 2);
    const long long said = attach_and_detach_spinning(8);
    ASSERT_GT(target_->command("stop"), 0);
    const std::string r = iprobe({"report", pid_, "--json"}).out;
    const long long calls = json_calls(r, "v_spin"), completed = json_completed(r, "v_spin");
    EXPECT_GT(calls, 0) << r;
    const long long counted = json_number(r, "exits_lost_at_detach");
    EXPECT_GE(counted, said) << r;
    EXPECT_NEAR(static_cast<double>(calls - (completed - json_number(r, "unmatched_exits"))),
                static_cast<double>(counted), 2.0)
        << r;
    EXPECT_GT(said, 0) << "no detach found a call in flight in 8 rounds" << r;
    EXPECT_EQ(json_number(r, "unhooked_returns"), 0) << r;
}

// ... and the stream says each of them where it happened: a trace reading
// all the while (to a file) gets, on each thread's next event after a
// detach that lost calls of it, a mark whose counts add up to exactly what
// the detaches said, while detaches write marks and the reader takes them
// at once.
TEST_P(FinstrumentValuesTest, EveryExitADetachLostUnderLoadIsSaidInTheStream) {
    TempDir dir;
    const std::string file = dir / "load.trace";
    attach({"--functions", "v_spin"});  // the region the trace reads
    ASSERT_EQ(iprobe({"detach", pid_}).exit_code, 0);
    Child trace({iprobe_bin(), "trace", pid_, "--output", file}, dir / "trace.out");
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the reader is draining
    ASSERT_EQ(target_->command("spin 2"), 2);
    const long long said = attach_and_detach_spinning(8);
    attach({"--functions", "v_spin"});  // each thread's next events, after its last mark
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ASSERT_GT(target_->command("stop"), 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    trace.kill(SIGINT);
    ASSERT_EQ(trace.wait(std::chrono::seconds(60)), 0);
    long long marked = 0, marks = 0;
    hotpatch::TraceFileReader read(file);
    while (read.next([&](const hotpatch::Event& e) {
        for (const hotpatch::LostExits& l : e.exits_lost_before) {
            EXPECT_EQ(l.function, "v_spin");
            marked += static_cast<long long>(l.count);
            marks++;
        }
    })) {
    }
    EXPECT_GT(said, 0) << "no detach found a call in flight in 8 rounds";
    EXPECT_EQ(marked, said) << marks << " marks";
    EXPECT_LE(marks, 2 * 8) << "one a thread and detach at most";
}

// An inlined copy (in_visit, always_inline, in in_loop's loop): its hooks
// are in in_loop's code, its parameters where its DW_TAG_inlined_subroutine
// says they are at the entry hook (n: rbx - 1, it and name: registers;
// spare, n * 7, a computation: <optimized out>).  It does not return: its
// exit hook records the exit without a value, and says so.
TEST_P(FinstrumentValuesTest, InlinedCopyArgumentsComeFromItsScope) {
    auto a = iprobe({"attach", pid_, "--args", "--retval", "--functions", "in_visit*,in_loop", "--json"});
    ASSERT_EQ(a.exit_code, 0) << a.out << a.err;
    // its three copies' exits (in in_loop, in in_pair, and in in_pair's copy in in_nested)
    EXPECT_EQ(json_number(a.out, "values_no_return"), 3) << a.out;
    EXPECT_EQ(json_number(a.out, "values_unavailable"), 0) << a.out;
    EXPECT_EQ(target_->command("loop 20 alpha"), 590);
    const std::string t = trace("json");
    for (int n = 0; n < 20; n++)
        EXPECT_EQ(lines_with(t, {entry_of(visit()),
                                 visit_args(n, "alpha") + "," + arg("spare", "int", "\"<optimized out>\"") + "]"})
                      .size(),
                  1u)
            << n << "\n" << t;
    EXPECT_EQ(lines_with(t, {entry_of(visit())}).size(), 20u) << t;
    EXPECT_EQ(lines_with(t, {exit_of(visit())}).size(), 20u) << t;
    EXPECT_EQ(lines_with(t, {exit_of(visit()), "retval"}).size(), 0u) << t;
    EXPECT_EQ(lines_with(t, {exit_of("in_loop"), retval("long", "590")}).size(), 1u) << t;
    EXPECT_EQ(lines_with(t, {exit_of("in_loop")}).size(), 1u) << t;
    EXPECT_EQ(t.find("unwound"), std::string::npos) << t;  // the copies nest in in_loop's frame
    auto text = iprobe({"attach", pid_, "--args", "--retval", "--functions", "in_visit*"});
    EXPECT_NE(text.out.find("3 exit hook(s) of inlined copies record no return value: an inlined copy does not return"),
              std::string::npos)
        << text.out;
    const auto h = iprobe({"report", pid_, "--hist"});
    EXPECT_NE(h.out.find(visit() + ": latency of 20 timed calls (20 completed)"), std::string::npos) << h.out;
    EXPECT_NE(h.out.find(visit() + ": return value of 0 calls (20 more completed calls had none: an inlined copy does "
                                   "not return"),
              std::string::npos)
        << h.out;
    // timed as without values: its entry's frame is popped by its exit hook
    auto r = iprobe({"report", pid_, "--json"});
    EXPECT_EQ(json_calls(r.out, visit_pattern()), 20) << r.out;
    EXPECT_NE(r.out.find("\"calls\":20,\"completed\":20,\"timed\":20"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("\"unmatched_exits\":0"), std::string::npos) << r.out;
}

// Inlined copies in the file: their arguments, their exits without a value
// (values_no_return), nested in their host as live; and a --when's verdicts.
TEST_P(FinstrumentValuesTest, TheTraceFileConvertsBackToExactlyTheLiveStream) {
    attach({"--args", "--retval", "--functions", "in_visit*,in_loop"});
    const std::string t = file_is_live("loop 20 alpha");
    EXPECT_EQ(lines_with(t, {entry_of(visit())}).size(), 20u) << t;
    EXPECT_EQ(lines_with(t, {exit_of(visit())}).size(), 20u) << t;
    EXPECT_EQ(lines_with(t, {exit_of(visit()), "retval"}).size(), 0u) << t;
    EXPECT_EQ(lines_with(t, {exit_of("in_loop"), retval("long", "590")}).size(), 1u) << t;
    EXPECT_EQ(t.find("unwound"), std::string::npos) << t;
    attach({"--args", "--when", "n == 10 || n == 13", "--functions", "in_visit*"});
    const std::string when = file_is_live("loop 20 alpha");
    EXPECT_EQ(lines_with(when, {entry_of(visit())}).size(), 2u) << when;
    attach({"--args", "--retval", "--functions", "v_*,Counter*"});
    file_is_live("values");
}

TEST_P(FinstrumentValuesTest, WhenOnAnInlinedCopysArgumentRecordsExactlyTheMatchingCalls) {
    attach({"--args", "--when", "n == 10 || n == 13", "--functions", "in_visit*"});
    EXPECT_EQ(target_->command("loop 20 alpha"), 590);
    EXPECT_EQ(target_->command("loop 20 beta"), 590);
    const std::string t = trace("json");
    EXPECT_EQ(lines_with(t, {entry_of(visit()), "\"args\":[" + arg("n", "int", "10")}).size(), 2u) << t;
    EXPECT_EQ(lines_with(t, {entry_of(visit()), "\"args\":[" + arg("n", "int", "13")}).size(), 2u) << t;
    EXPECT_EQ(lines_with(t, {entry_of(visit()), arg("name", "const char*", "\"beta\"")}).size(), 2u) << t;
    EXPECT_EQ(lines_with(t, {entry_of(visit())}).size(), 4u) << t;
    // each exit recorded as its entry was (its verdict kept in the call's frame)
    EXPECT_EQ(lines_with(t, {exit_of(visit())}).size(), 4u) << t;
    auto r = iprobe({"report", pid_, "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(json_calls(r.out, visit_pattern()), 40) << r.out;
    EXPECT_NE(r.out.find("\"matched\":4,\"undecided\":0"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("\"unmatched_exits\":0"), std::string::npos) << r.out;
    // a string compare on the copy's char*
    attach({"--args", "--when", "name == \"beta\" && n < 3", "--functions", "in_visit*"});
    EXPECT_EQ(target_->command("loop 20 alpha"), 590);
    EXPECT_EQ(target_->command("loop 20 beta"), 590);
    const std::string s = trace("text");
    EXPECT_EQ(lines_with(s, {" -> " + visit() + "(", "name=\"beta\""}).size(), 3u) << s;
    EXPECT_EQ(lines_with(s, {" -> " + visit() + "("}).size(), 3u) << s;
    EXPECT_EQ(lines_with(s, {" <- " + visit() + "("}).size(), 3u) << s;
    // without the condition its exit hooks' stubs are the plain ones again
    attach({"--functions", "in_visit*"});
    EXPECT_EQ(target_->command("loop 20 gamma"), 590);
    const std::string all = trace("json");
    EXPECT_EQ(lines_with(all, {entry_of(visit())}).size(), 20u) << all;
    EXPECT_EQ(lines_with(all, {exit_of(visit())}).size(), 20u) << all;
    EXPECT_EQ(all.find("\"args\""), std::string::npos) << all;
}

// No return: a condition on its return value or duration is refused with
// the reason; nothing changes.
TEST_P(FinstrumentValuesTest, WhenOnAnInlinedCopysReturnIsRefused) {
    for (const std::string when : {"retval == 3", "duration > 1us && n == 1"}) {
        auto a = iprobe({"attach", pid_, "--when", when, "--functions", "in_visit*"});
        EXPECT_EQ(a.exit_code, 3) << when << a.out << a.err;
        EXPECT_NE(a.err.find("reads retval or duration, which " + visit() + "'s inlined copy at 0x"), std::string::npos) << a.err;
        EXPECT_NE(a.err.find("does not return"), std::string::npos) << a.err;
    }
    auto s = iprobe({"status", pid_, "--json"});
    EXPECT_EQ(s.out.find("in_visit"), std::string::npos) << "nothing enabled\n" << s.out;
}

// A copy whose hook has a parameter the --when names optimized out cannot
// decide it (the out-of-line copy can): said at attach; its calls are
// counted, none recorded, none matched.
TEST_P(FinstrumentValuesTest, WhenOnAParameterAnInlinedCopyLacksRecordsNoneOfItsCalls) {
    auto a = iprobe({"attach", pid_, "--args", "--when", "spare == 7", "--functions", "in_visit*", "--json"});
    ASSERT_EQ(a.exit_code, 0) << a.out << a.err;
    EXPECT_EQ(json_number(a.out, "when_undecidable"), 3) << a.out;  // its three copies
    auto text = iprobe({"attach", pid_, "--args", "--when", "spare == 7", "--functions", "in_visit*"});
    EXPECT_NE(text.out.find("3 inlined cop(ies) cannot decide the --when: a parameter it names is optimized out"),
              std::string::npos)
        << text.out;
    EXPECT_EQ(target_->command("loop 20 alpha"), 590);
    const std::string t = trace("json");
    EXPECT_EQ(t.find(visit()), std::string::npos) << t;
    auto r = iprobe({"report", pid_, "--json"});
    EXPECT_EQ(json_calls(r.out, visit_pattern()), 20) << r.out;
    EXPECT_NE(r.out.find("\"matched\":0,\"undecided\":0"), std::string::npos) << r.out;
}

// A copy in a copy (in_visit inlined into in_pair, inlined into in_nested):
// the innermost DW_TAG_inlined_subroutine of in_visit holding the hook.
// All three hooks record in_nested's frame: each call nests in the one open
// there (one exit each, none unwound).
TEST_P(FinstrumentValuesTest, CopyInACopyHasItsArguments) {
    attach({"--args", "--functions", "in_visit*,in_pair*,in_nested"});
    EXPECT_EQ(target_->command("nested 5 beta"), 5035);
    const std::string t = trace("json");
    for (int n = 0; n < 5; n++)
        EXPECT_EQ(lines_with(t, {entry_of(visit()), visit_args(n, "beta")}).size(), 1u) << n << "\n" << t;
    EXPECT_EQ(lines_with(t, {entry_of(visit())}).size(), 5u) << t;
    EXPECT_EQ(lines_with(t, {exit_of(visit())}).size(), 5u) << t;
    const std::string pair = cxx() ? "in_pair(int, item*, char const*)" : "in_pair";
    EXPECT_EQ(lines_with(t, {entry_of(pair), "\"depth\":1"}).size(), 5u) << t;
    EXPECT_EQ(lines_with(t, {entry_of(visit()), "\"depth\":2"}).size(), 5u) << t;
    EXPECT_EQ(lines_with(t, {exit_of(pair)}).size(), 5u) << t;
    EXPECT_EQ(lines_with(t, {exit_of("in_nested")}).size(), 1u) << t;
    EXPECT_EQ(t.find("unwound"), std::string::npos) << t;
}

// A recursive static inline function gcc inlined into itself: each call's
// n from the copy whose hook it is (its own code holds copies of it), the
// calls and completions exact, and a --when on n records exactly the one
// call's entry; one exit each and none `unwound` (the copies' hooks record
// their host's frame: each nests in the call open there, not ends it).
TEST_P(FinstrumentValuesTest, CopiesOfARecursiveFunctionInItsOwnCodeHaveTheirArguments) {
    const std::string rec = cxx() ? "in_rec(int)" : "in_rec";
    attach({"--args", "--functions", "in_rec*"});
    EXPECT_EQ(target_->command("rec 12"), 78);
    const std::string t = trace("json");
    // every n once, but where a copy's hook has it nowhere readable (gcc 12's C build: one)
    std::size_t shown = 0;
    for (int n = 0; n <= 12; n++) {
        const std::size_t k = lines_with(t, {entry_of(rec), "\"args\":[" + arg("n", "int", std::to_string(n)) + "]"}).size();
        EXPECT_LE(k, 1u) << n << "\n" << t;
        shown += k;
    }
    const std::size_t hidden = lines_with(t, {entry_of(rec), arg("n", "int", "\"<optimized out>\"")}).size();
    EXPECT_LE(hidden, 1u) << t;
    EXPECT_EQ(shown + hidden, 13u) << t;
    EXPECT_EQ(lines_with(t, {entry_of(rec)}).size(), 13u) << t;
    // one exit each: a copy's hook has its host's frame, which it nests in, not ends
    EXPECT_EQ(lines_with(t, {exit_of(rec)}).size(), 13u) << t;
    EXPECT_EQ(lines_with(t, {entry_of("in_rec_top")}).size(), 1u) << t;
    EXPECT_EQ(lines_with(t, {exit_of("in_rec_top")}).size(), 1u) << t;
    EXPECT_EQ(t.find("unwound"), std::string::npos) << t;
    const std::string pattern = cxx() ? "in_rec\\(int\\)" : "in_rec";
    auto r = iprobe({"report", pid_, "--json"});
    EXPECT_EQ(json_calls(r.out, pattern), 13) << r.out;
    EXPECT_EQ(json_completed(r.out, pattern), 13) << r.out;
    EXPECT_NE(r.out.find("\"unmatched_exits\":0"), std::string::npos) << r.out;
    attach({"--args", "--when", "n == 3", "--functions", "in_rec*"});
    EXPECT_EQ(target_->command("rec 12"), 78);
    const std::string w = trace("json");
    EXPECT_EQ(lines_with(w, {entry_of(rec), "\"args\":[" + arg("n", "int", "3") + "]"}).size(), 1u) << w;
    EXPECT_EQ(lines_with(w, {entry_of(rec)}).size(), 1u) << w;
}

// Its backtrace starts at its host (in_loop, at the copy's hook), then the
// host's callers, as deep as asked.
TEST_P(FinstrumentValuesTest, InlinedCopyBacktraceStartsAtItsHost) {
    attach({"--args", "--backtrace=2", "--functions", "in_visit*,in_loop"});
    EXPECT_EQ(target_->command("loop 2 alpha"), 5);
    const std::string t = trace("json");
    const auto entries = lines_with(t, {entry_of(visit()), "\"backtrace\":["});
    ASSERT_EQ(entries.size(), 2u) << t;
    const std::regex frames("\"backtrace\":\\[\\{\"address\":\"0x[0-9a-f]+\",\"function\":\"in_loop\",\"file\":\"[^\"]*"
                            "values_target.c\",\"line\":[0-9]+\\},\\{\"address\":\"0x[0-9a-f]+\",\"function\":\"main\"[^}]*\\}\\]");
    for (const auto& e : entries) EXPECT_TRUE(std::regex_search(e, frames)) << e;
}

// C++: a member function defined in its class, inlined into its caller's
// loop: `this` (a register), k (rbx - 6), v (the constant 3).
TEST_F(ValuesTest, FinstrumentInlinedMemberFunctionHasThisAndItsArguments) {
    ASSERT_TRUE(start("values_finstrument_cxx"));
    attach({"--args", "--functions", "Accum::*"});
    EXPECT_EQ(target_->command("members 4"), 4 * 6 + 6);
    std::smatch m;
    const std::string out = target_->output();
    ASSERT_TRUE(std::regex_search(out, m, std::regex("accum (0x[0-9a-f]+)"))) << out;
    const std::string t = trace("json");
    for (int k = 0; k < 4; k++)
        EXPECT_EQ(lines_with(t, {entry_of("Accum::add_scaled(int, long)"),
                                 "{\"name\":\"this\",\"type\":\"", "\",\"value\":\"" + m[1].str() + "\"}," +
                                     arg("k", "int", std::to_string(k)) + "," + arg("v", "long", "3")})
                      .size(),
                  1u)
            << k << "\n" << t;
}

INSTANTIATE_TEST_SUITE_P(Flows, FinstrumentValuesTest, ::testing::Values("values_finstrument", "values_finstrument_cxx"));

// An inlined copy's hooks sit in its caller's code: its arguments come from
// its DW_TAG_inlined_subroutine, its exit has no return value (said at
// attach), the caller's values are whole, and a --when on the copy's
// arguments holds.
TEST_F(ValuesTest, FinstrumentInlinedCopyRecordsItsArgumentsButNoReturnValue) {
    ASSERT_TRUE(start("values_finstrument"));
    auto a = iprobe({"attach", pid_, "--args", "--retval", "--functions", "twice,v_inlined"});
    ASSERT_EQ(a.exit_code, 0) << a.err;
    EXPECT_NE(a.out.find("1 exit hook(s) of inlined copies record no return value"), std::string::npos) << a.out;
    EXPECT_EQ(target_->command("inlined 5"), 11);
    const std::string t = trace("json");
    EXPECT_EQ(lines_with(t, {entry_of("v_inlined"), arg("v", "long", "5")}).size(), 1u) << t;
    EXPECT_EQ(lines_with(t, {exit_of("v_inlined"), retval("long", "11")}).size(), 1u) << t;
    EXPECT_EQ(lines_with(t, {entry_of("twice"), "\"args\":[" + arg("v", "long", "5") + "]"}).size(), 1u) << t;
    EXPECT_EQ(lines_with(t, {exit_of("twice")}).size(), 1u) << t;
    EXPECT_EQ(lines_with(t, {exit_of("twice"), "retval"}).size(), 0u) << t;
    // twice's hook records v_inlined's frame: it nests there, v_inlined is not unwound
    EXPECT_EQ(lines_with(t, {exit_of("v_inlined")}).size(), 1u) << t;
    EXPECT_EQ(t.find("unwound"), std::string::npos) << t;
    const auto h = iprobe({"report", pid_, "--hist"});
    EXPECT_NE(h.out.find("v_inlined: return value of 1 calls"), std::string::npos) << h.out;
    // v_inlined's exit probe is not the one after its entry (twice's hooks
    // come between): a condition decided at its exit still finds its entry
    attach({"--args", "--retval", "--when", "retval == 11 && v == 5", "--functions", "v_inlined"});
    EXPECT_EQ(target_->command("inlined 5"), 11);
    EXPECT_EQ(target_->command("inlined 6"), 13);
    const std::string held = trace("json");
    EXPECT_EQ(lines_with(held, {entry_of("v_inlined"), arg("v", "long", "5")}).size(), 1u) << held;
    EXPECT_EQ(lines_with(held, {exit_of("v_inlined"), retval("long", "11")}).size(), 1u) << held;
    EXPECT_EQ(lines_with(held, {"v_inlined"}).size(), 2u) << held;
    attach({"--args", "--when", "v == 6", "--functions", "twice"});
    EXPECT_EQ(target_->command("inlined 5"), 11);
    EXPECT_EQ(target_->command("inlined 6"), 13);
    const std::string copy = trace("json");
    EXPECT_EQ(lines_with(copy, {entry_of("twice"), arg("v", "long", "6")}).size(), 1u) << copy;
    EXPECT_EQ(lines_with(copy, {"\"function\":\"twice\""}).size(), 2u) << copy;
    auto w = iprobe({"attach", pid_, "--when", "retval == 10", "--functions", "twice"});
    EXPECT_EQ(w.exit_code, 3) << w.out << w.err;
    EXPECT_NE(w.err.find("twice's inlined copy at 0x"), std::string::npos) << w.err;
}

// After the prologue the argument registers hold something else: without
// DWARF the -finstrument-functions flow records no values, and says so.
TEST_F(ValuesTest, FinstrumentWithoutDebugInfoSaysItRecordsNoValues) {
    ASSERT_TRUE(start("values_finstrument_nodebug"));
    auto a = iprobe({"attach", pid_, "--args", "--functions", "v_ints"});
    ASSERT_EQ(a.exit_code, 0) << a.err;
    EXPECT_NE(a.out.find("2 selected probe(s) record no values"), std::string::npos) << a.out;
    EXPECT_NE(a.out.find("raw arg0..arg5 cannot be had there"), std::string::npos) << a.out;
    target_->command("values");
    const std::string t = trace("json");
    EXPECT_EQ(lines_with(t, {entry_of("v_ints")}).size(), 1u) << t;
    EXPECT_EQ(lines_with(t, {exit_of("v_ints")}).size(), 1u) << t;
    EXPECT_EQ(t.find("\"args\""), std::string::npos) << t;
    auto w = iprobe({"attach", pid_, "--when", "arg0 == 7", "--functions", "v_ints"});
    EXPECT_EQ(w.exit_code, 3) << w.out << w.err;
    EXPECT_NE(w.err.find("needs its DWARF (build with -g)"), std::string::npos) << w.err;
}

// In the -finstrument-functions flow values change the site's stubs (the
// entry's goes to the recipe's entry point, the exit hooks' to a checked
// exit, which leaves a hooked call's exit to its trampoline): attaching
// again without them puts the entry's plain stub back and the exit hooks
// record every call again, so every call still has exactly one exit, and
// the count handler counts them again.
TEST_F(ValuesTest, FinstrumentAttachAgainWithoutValuesGivesEveryCallOneExit) {
    ASSERT_TRUE(start("values_finstrument"));
    attach({"--args", "--retval", "--functions", "v_ints"});
    target_->command("values");
    attach({"--functions", "v_ints"});
    target_->command("values");
    const std::string t = trace("json");
    EXPECT_EQ(lines_with(t, {entry_of("v_ints")}).size(), 2u) << t;
    EXPECT_EQ(lines_with(t, {entry_of("v_ints"), "\"args\":[" + arg("a", "int", "7")}).size(), 1u) << t;
    EXPECT_EQ(lines_with(t, {exit_of("v_ints")}).size(), 2u) << t;
    EXPECT_EQ(lines_with(t, {exit_of("v_ints"), retval("long", "16")}).size(), 1u) << t;
    attach({"--args", "--functions", "v_ints"});
    attach({"--handler", "count", "--completed", "--functions", "v_ints"});
    target_->command("values");
    auto r = iprobe({"report", pid_, "--json"});
    EXPECT_EQ(json_calls(r.out, "v_ints"), 3) << r.out;
    EXPECT_NE(r.out.find("\"completed\":3"), std::string::npos) << r.out;
}

// Attaching again with other value options changes what the next calls
// record; the events already in the ring keep what they were recorded with.
TEST_F(ValuesTest, AttachAgainChangesWhatIsRecordedAndEarlierEventsKeepTheirs) {
    ASSERT_TRUE(start("values_c"));
    attach({"--args", "--retval", "--functions", "v_ints"});
    target_->command("values");
    attach({"--functions", "v_ints"});
    target_->command("values");
    attach({"--retval", "--functions", "v_ints"});
    target_->command("values");
    const std::string t = trace("json");
    const std::string args = "\"args\":[" + arg("a", "int", "7");
    EXPECT_EQ(lines_with(t, {entry_of("v_ints")}).size(), 3u) << t;
    EXPECT_EQ(lines_with(t, {entry_of("v_ints"), args}).size(), 1u) << t;
    EXPECT_EQ(lines_with(t, {exit_of("v_ints")}).size(), 3u) << t;
    EXPECT_EQ(lines_with(t, {exit_of("v_ints"), retval("long", "16")}).size(), 2u) << t;
    auto r = iprobe({"report", pid_, "--json"});
    EXPECT_EQ(json_calls(r.out, "v_ints"), 3) << r.out;
}

// The binary file keeps values: converted back it prints what the live
// trace printed of the same events, in every format (ints, enums, strings
// NULL and dangling, doubles, structs by value, `this`), and JSON holds
// every value exactly.
TEST_P(TypedValuesTest, TheTraceFileConvertsBackToExactlyTheLiveStream) {
    attach({"--args", "--retval", "--functions", "v_*,Counter*,fib"});
    expect_every_kind(file_is_live("values"), "8", "true", "false", "3");
    const std::string fib = file_is_live("fib 10");
    EXPECT_EQ(lines_with(fib, {exit_of("fib"), retval("long", "55")}).size(), 1u) << fib;
    attach({"--args", "--backtrace=3", "--functions", "bt_*"});
    expect_three_callers(file_is_live("bt 1"));
}

// A --when's verdicts, as live: only the matching calls are in the file.
TEST_P(TypedValuesTest, TheTraceFileKeepsWhatAWhenRecorded) {
    attach({"--args", "--retval", "--when", "n == 10", "--functions", "fib"});
    const std::string t = file_is_live("fib 10");
    EXPECT_EQ(lines_with(t, {entry_of("fib"), arg("n", "int", "10")}).size(), 1u) << t;
    EXPECT_EQ(lines_with(t, {entry_of("fib")}).size(), 1u) << t;
    EXPECT_EQ(lines_with(t, {exit_of("fib"), retval("long", "55")}).size(), 1u) << t;
}

// A lossless trace to the file with values: every call's entry with its
// arguments and exit with its return value, none dropped, through a ring
// of 1024 records.
TEST_F(ValuesTest, LosslessTraceFileKeepsEveryCallsValues) {
    ASSERT_TRUE(start("values_c"));
    attach({"--args", "--retval", "--functions", "fib", "--ring-records", "1024"});
    TempDir dir;
    const std::string file = dir / "fib.trace";
    Child trace({iprobe_bin(), "trace", pid_, "--output", file, "--lossless"}, dir / "trace.out");
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the reader is draining
    EXPECT_EQ(target_->command("fib 20", std::chrono::seconds(120)), 6765);  // 21891 calls of fib, some inlined
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    trace.kill(SIGINT);
    ASSERT_EQ(trace.wait(std::chrono::seconds(60)), 0);
    auto converted = iprobe({"trace", "--input", file, "--format", "json"});
    ASSERT_EQ(converted.exit_code, 0) << converted.err;
    const std::string& t = converted.out;
    // gcc inlines some of fib's recursion into itself: the calls made
    // through its entry are the report's (exact) count
    const std::string r = iprobe({"report", pid_, "--json"}).out;
    const long long calls = json_calls(r, "fib");
    EXPECT_GT(calls, 1000) << r;
    EXPECT_EQ(json_completed(r, "fib"), calls) << r;
    EXPECT_EQ(static_cast<long long>(lines_with(t, {entry_of("fib"), "\"args\":[{\"name\":\"n\",\"type\":\"int\",\"value\":"}).size()), calls);
    EXPECT_EQ(static_cast<long long>(lines_with(t, {exit_of("fib"), "\"retval\":{\"type\":\"long\",\"value\":"}).size()), calls);
    EXPECT_EQ(lines_with(t, {entry_of("fib"), arg("n", "int", "20")}).size(), 1u);
    EXPECT_EQ(lines_with(t, {exit_of("fib"), retval("long", "6765")}).size(), 1u);
    EXPECT_EQ(json_number(r, "trace_dropped"), 0) << r;
}

// A file cut short (a trace killed mid-write) or of another version: one
// clear line, exit 3.
TEST_F(ValuesTest, ACutOrForeignTraceFileIsRefusedClearly) {
    ASSERT_TRUE(start("values_c"));
    attach({"--args", "--retval", "--functions", "v_*"});
    target_->command("values");
    TempDir dir;
    const std::string file = dir / "t.trace";
    ASSERT_EQ(iprobe({"trace", pid_, "--duration", "0", "--output", file}).exit_code, 0);
    std::string bytes;
    {
        std::ifstream in(file, std::ios::binary);
        bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes.substr(0, bytes.size() / 2);
    auto cut = iprobe({"trace", "--input", file});
    EXPECT_EQ(cut.exit_code, 3) << cut.out << cut.err;
    EXPECT_NE(cut.err.find("ends early"), std::string::npos) << cut.err;
    bytes[8] = 1;
    std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
    auto old = iprobe({"trace", "--input", file});
    EXPECT_EQ(old.exit_code, 3) << old.out << old.err;
    EXPECT_NE(old.err.find("trace file version 1, but this iprobe reads versions 2 to 6"), std::string::npos) << old.err;
}

TEST_F(ValuesTest, ValuesNeedTheTraceHandler) {
    ASSERT_TRUE(start("values_c"));
    auto a = iprobe({"attach", pid_, "--args", "--handler", "count"});
    EXPECT_EQ(a.exit_code, 2) << a.err;
    EXPECT_NE(a.err.find("--handler trace"), std::string::npos) << a.err;
}

}  // namespace
}  // namespace iprobe::test
