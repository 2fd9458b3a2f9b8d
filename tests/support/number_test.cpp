// Command-line numbers: whole text, whole range, or a usage error.
#include <gtest/gtest.h>

#include "iprobe/support/error.h"
#include "iprobe/support/number.h"

namespace iprobe {
namespace {

ExitCode code_of(auto&& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.code();
    }
    return ExitCode::ok;
}

TEST(Number, PidsAreCheckedOverTheirWholeRange) {
    EXPECT_EQ(parse_pid_or_usage("1"), 1);
    EXPECT_EQ(parse_pid_or_usage("4194304"), 4194304);
    for (const char* bad : {"0", "-1", "4194305", "4294967296", "4294968519", "99999999999", "18446744073709551617",
                            "12abc", " 12", "+12", "0x10", ""})
        EXPECT_EQ(code_of([&] { parse_pid_or_usage(bad); }), ExitCode::usage) << bad;
}

TEST(Number, UnsignedRangeAndDigitsOnly) {
    EXPECT_EQ(parse_unsigned("18446744073709551615"), UINT64_MAX);
    EXPECT_FALSE(parse_unsigned("18446744073709551616"));
    EXPECT_FALSE(parse_unsigned("5", 6, 10));
    EXPECT_FALSE(parse_unsigned("-5"));
    EXPECT_EQ(code_of([] { parse_unsigned_or_usage("70000", "--port", 1, 65535); }), ExitCode::usage);
}

TEST(Number, DecimalsAreFiniteAndInRange) {
    EXPECT_DOUBLE_EQ(parse_decimal_or_usage("1.5", "--duration", 0, 10), 1.5);
    for (const char* bad : {"inf", "nan", "1e999", "-1", "11", "1.5s", "0x1p3", ""})
        EXPECT_EQ(code_of([&] { parse_decimal_or_usage(bad, "--duration", 0, 10); }), ExitCode::usage) << bad;
}

}  // namespace
}  // namespace iprobe
