// `--args --retval` on a program of thousands of functions whose DWARF
// covers few of them, as node's static V8 (71 000 functions, a few hundred
// units): values_many (targets/values_many.c, 3000 functions) built with
// its functions' DWARF and without it, probed from its symbols (plain gcc,
// as a packaged program comes).  Each function's values are planned from
// the one index of the file's DWARF (elf/src/dwarf_types.h, FunctionDies):
// the counts the attach says, the typed and raw values recorded and the
// program's output are exact.  How long the planning takes is bench/'s
// (bench/hotpatch/values_scale.sh).
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <regex>
#include <thread>

#include <gtest/gtest.h>

#include "hotpatch_fixture.h"

namespace iprobe::test {
namespace {

constexpr int kFunctions = 3000;
// the sum values_many prints: typed_add(7, -3) + gen_i(i, 1) = i * (i + 3) ^ 1 for each i
const std::string kOutput = "3000 functions, sum 9008999004\n";

std::string arg(const std::string& name, const std::string& type, const std::string& value) {
    return "{\"name\":\"" + name + "\",\"type\":\"" + type + "\",\"value\":" + value + "}";
}
std::string entry_of(const std::string& function) {
    return "\"kind\":\"entry\",\"function\":\"" + function + "\"";
}
std::string exit_of(const std::string& function) { return "\"kind\":\"exit\",\"function\":\"" + function + "\""; }
std::string retval(const std::string& type, const std::string& value) {
    return "\"retval\":{\"type\":\"" + type + "\",\"value\":" + value + "}";
}

class ValuesScaleTest : public ::testing::TestWithParam<std::string> {
protected:
    void SetUp() override {
        if (!is_root()) GTEST_SKIP() << "needs root (ptrace of any process, /run/iprobe)";
        binary_ = targets_dir() + "/" + GetParam();
        ASSERT_TRUE(std::filesystem::exists(binary_)) << binary_ << " not built";
    }
    bool typed() const { return GetParam() == "values_many_debug"; }
    std::string binary_;
};

// Attached to the running program, every gen_* and typed_add: the functions
// without DWARF are counted (values_untyped), each other's values typed.
TEST_P(ValuesScaleTest, EveryFunctionsValuesAreRecordedAndTheUntypedCounted) {
    HpTarget target(1, binary_);
    const std::string pid = std::to_string(target.pid());
    auto a = iprobe({"attach", pid, "--args", "--retval", "--functions", "gen_*,typed_add", "--buffer", "16M", "--json"},
                    std::chrono::seconds(120));
    ASSERT_EQ(a.exit_code, 0) << a.out << a.err;
    EXPECT_EQ(json_number(a.out, "selected"), 2 * (kFunctions + 1)) << a.out;  // an entry and an exit probe each
    EXPECT_EQ(json_number(a.out, "refused"), 0) << a.out;
    EXPECT_EQ(json_number(a.out, "values_untyped"), typed() ? 0 : kFunctions) << a.out;
    EXPECT_EQ(json_number(a.out, "values_unavailable"), 0) << a.out;
    EXPECT_EQ(json_number(a.out, "values_optimized_out"), 0) << a.out;
    EXPECT_EQ(json_number(a.out, "values_no_return"), 0) << a.out;

    ASSERT_EQ(::kill(target.pid(), SIGUSR1), 0);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (target.output().find("done") == std::string::npos && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ASSERT_EQ(target.output(), "ready\n" + kOutput + "done\n");

    auto t = iprobe({"trace", pid, "--format", "json", "--duration", "0"}, std::chrono::seconds(120));
    ASSERT_EQ(t.exit_code, 0) << t.err;
    EXPECT_EQ(lines_with(t.out, {"\"kind\":\"entry\",\"function\":\"gen_"}).size(), std::size_t(kFunctions));
    EXPECT_EQ(lines_with(t.out, {"\"kind\":\"exit\",\"function\":\"gen_"}).size(), std::size_t(kFunctions));
    // typed_add has its DWARF in both builds
    EXPECT_EQ(lines_with(t.out, {entry_of("typed_add"), "\"args\":[" + arg("a", "int", "7") + "," + arg("b", "long", "-3") + "]"})
                  .size(),
              1u)
        << t.out.substr(0, 4000);
    EXPECT_EQ(lines_with(t.out, {exit_of("typed_add"), retval("long", "4")}).size(), 1u);
    // gen_2999(2999, 1): named and typed from its DWARF, else raw arg0, arg1
    const std::string first_two = typed() ? arg("a", "long", "2999") + "," + arg("b", "long", "1") + "]"
                                          : arg("arg0", "uint64_t", "2999") + "," + arg("arg1", "uint64_t", "1") + ",";
    EXPECT_EQ(lines_with(t.out, {entry_of("gen_2999"), "\"args\":[" + first_two}).size(), 1u) << t.out.substr(0, 4000);
    EXPECT_EQ(lines_with(t.out, {exit_of("gen_2999"), retval(typed() ? "long" : "uint64_t", "9002999")}).size(), 1u);
}

// `iprobe run --args --retval`, every function of the program: it runs as
// without probes, its output byte for byte.
TEST_P(ValuesScaleTest, RunWithValuesOfEveryFunctionKeepsTheProgramsOutput) {
    const auto plain = run({binary_, "--run"});
    ASSERT_EQ(plain.exit_code, 0) << plain.err;
    ASSERT_EQ(plain.out, kOutput);
    const auto probed =
        run({iprobe_bin(), "run", "--args", "--retval", "--buffer", "16M", "--", binary_, "--run"}, {}, std::chrono::seconds(120));
    ASSERT_EQ(probed.exit_code, 0) << probed.err;
    EXPECT_EQ(probed.out, kOutput);
    // probed all the while: its report (stderr) has each call, completed
    for (const std::string f : {"typed_add", "gen_0000", "gen_2999"})
        EXPECT_TRUE(std::regex_search(probed.err, std::regex("\n" + f + " +1 +1 "))) << f << "\n" << probed.err.substr(0, 2000);
}

INSTANTIATE_TEST_SUITE_P(Builds, ValuesScaleTest, ::testing::Values("values_many_debug", "values_many_nodebug"));

}  // namespace
}  // namespace iprobe::test
