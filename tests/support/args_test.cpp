#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "iprobe/support/args.h"
#include "iprobe/support/error.h"

namespace iprobe {
namespace {

ArgSpec spec() {
    return ArgSpec("tool sub", "usage: tool sub FILE [options]", "Does a thing.",
                   {
                       {"--output", "FILE", "where to write", "-o"},
                       {"--functions", "GLOB", "only these;\nrepeatable"},
                       {"--json", "", "machine-readable output"},
                   },
                   "exit codes: 0 ok, 2 usage");
}

ParsedArgs parse(const ArgSpec& s, std::vector<std::string> args) { return s.parse(args); }

TEST(Args, BothValueFormsShortNamesFlagsAndRepeats) {
    const auto a = parse(spec(), {"in.bin", "--output", "a", "-o", "b", "--functions=f*", "--functions", "g*", "--json"});
    EXPECT_EQ(a.positionals(), std::vector<std::string>{"in.bin"});
    EXPECT_EQ(a.value("--output"), "b");  // the last one wins
    EXPECT_EQ(a.values("--functions"), (std::vector<std::string>{"f*", "g*"}));
    EXPECT_TRUE(a.has("--json"));
    EXPECT_FALSE(a.has("--nothing"));
    EXPECT_EQ(a.value("--nothing", "default"), "default");
    EXPECT_FALSE(a.help_requested());
    const auto empty = parse(spec(), {"--output="});
    EXPECT_TRUE(empty.has("--output"));
    EXPECT_EQ(empty.value("--output", "x"), "");  // given, and empty: not the fallback
}

TEST(Args, AnOptionalValueIsGivenOnlyWithEquals) {
    const ArgSpec s("tool", "usage: tool [--depth[=N]] FILE", "", {{"--depth", "N", "how deep", {}, true}});
    auto a = parse(s, {"--depth", "in.bin"});
    EXPECT_TRUE(a.has("--depth"));
    EXPECT_EQ(a.value("--depth", "none"), "");
    EXPECT_EQ(a.positionals(), std::vector<std::string>{"in.bin"}) << "the next word is never its value";
    a = parse(s, {"--depth=3", "in.bin"});
    EXPECT_EQ(a.value("--depth"), "3");
    EXPECT_FALSE(parse(s, {"in.bin"}).has("--depth"));
    EXPECT_NE(s.help().find("  --depth[=N]"), std::string::npos) << s.help();
}

TEST(Args, DoubleDashEndsOptionsOrStartsACommand) {
    auto a = parse(spec(), {"--json", "--", "--output", "-o"});
    EXPECT_EQ(a.positionals(), (std::vector<std::string>{"--output", "-o"}));
    EXPECT_TRUE(a.command().empty());
    ArgSpec with_command = spec();
    with_command.command_after_dashes();
    a = with_command.parse(std::vector<std::string>{"--json", "--", "prog", "--output"});
    EXPECT_TRUE(a.positionals().empty());
    EXPECT_EQ(a.command(), (std::vector<std::string>{"prog", "--output"}));
    EXPECT_EQ(parse(spec(), {"-", "-42"}).positionals(), (std::vector<std::string>{"-", "-42"}));
}

void expect_usage_error(const std::vector<std::string>& args, const std::string& says) {
    try {
        parse(spec(), args);
        ADD_FAILURE() << "accepted: " << says;
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ExitCode::usage);
        const std::string what = e.what();
        EXPECT_NE(what.find(says), std::string::npos) << what;
        EXPECT_NE(what.find("usage: tool sub FILE"), std::string::npos) << what;
        EXPECT_NE(what.find("see 'tool sub --help'"), std::string::npos) << what;
    }
}

TEST(Args, MistakesAreUsageErrorsNamingTheArgument) {
    expect_usage_error({"--bogus"}, "unknown option '--bogus'");
    expect_usage_error({"--bogus=1"}, "unknown option '--bogus'");
    expect_usage_error({"-x"}, "unknown option '-x'");
    expect_usage_error({"--output"}, "--output needs a value (FILE)");
    expect_usage_error({"--json=yes"}, "--json takes no value");
}

TEST(Args, HelpIsGeneratedFromTheTable) {
    EXPECT_TRUE(parse(spec(), {"x", "-h", "--bogus"}).help_requested());
    const std::string help = spec().help();
    EXPECT_EQ(help,
              "usage: tool sub FILE [options]\n"
              "\n"
              "Does a thing.\n"
              "\n"
              "options:\n"
              "  -o, --output FILE  where to write\n"
              "  --functions GLOB   only these;\n"
              "                     repeatable\n"
              "  --json             machine-readable output\n"
              "\n"
              "exit codes: 0 ok, 2 usage\n");
}

}  // namespace
}  // namespace iprobe
