// `--when`: the parser and compiler (hotpatch/condition.h) and the runtime's
// evaluator (runtime/src/condition.c, compiled into this test as C), exact:
// error positions, bytecode, and what a compiled program answers.
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include <gtest/gtest.h>

#include "iprobe/hotpatch/condition.h"
#include "../../runtime/src/condition.h"

namespace iprobe::hotpatch {
namespace {

ConditionSignature fib_like() {
    ConditionSignature s;
    s.has_dwarf = true;
    s.parameters = {{"n", "int", 0, 4, true, false},
                    {"key", "const char*", 1, 8, false, true},
                    {"len", "unsigned long", 2, 8, false, false},
                    {"x", "double", -1, 8, true, false},
                    {"small", "unsigned char", 3, 1, false, false}};
    s.retval = {"retval", "long", 0, 8, true, false};
    return s;
}

std::size_t error_at(const std::string& text, std::string* reason = nullptr) {
    try {
        (void)Condition::parse(text).compile(fib_like());
    } catch (const ConditionError& e) {
        if (reason) *reason = e.reason();
        EXPECT_EQ(e.code(), ExitCode::bad_input);
        return e.position();
    }
    ADD_FAILURE() << "no error for " << text;
    return std::string::npos;
}

struct Values {
    iprobe_cond_values v{};
    Values(std::initializer_list<std::uint64_t> args, std::uint64_t retval = 0, std::uint64_t duration = 0) {
        int i = 0;
        for (auto a : args) v.args[i++] = a;
        v.retval = retval;
        v.duration = duration;
    }
};

int evaluate(const iprobe_cond_program& p, const Values& values) { return iprobe_cond_evaluate(&p, &values.v); }

bool holds(const std::string& text, const Values& values, const ConditionSignature& s = fib_like()) {
    const iprobe_cond_program p = Condition::parse(text).compile(s);
    return iprobe_cond_evaluate(&p, &values.v) == 1;
}

TEST(ConditionParse, ErrorsPointAtTheirPosition) {
    std::string why;
    EXPECT_EQ(error_at("n == ", &why), 5u);
    EXPECT_EQ(why, "expected a value");
    EXPECT_EQ(error_at("n == 10 &&"), 10u);
    EXPECT_EQ(error_at("(n == 10"), 8u);
    EXPECT_EQ(error_at("n == 10)"), 7u);
    EXPECT_EQ(error_at("n == 10 # 3"), 8u);
    EXPECT_EQ(error_at("duration > 2xs", &why), 12u);
    EXPECT_EQ(why, "unknown unit 'xs' (durations take ns, us, ms or s)");
    EXPECT_EQ(error_at("key == \"abc"), 7u);
    EXPECT_EQ(error_at("arg6 == 1", &why), 0u);
    EXPECT_EQ(error_at("n == 99999999999999999999"), 5u);
    EXPECT_EQ(error_at(""), 0u);
    EXPECT_EQ(error_at("key == \"" + std::string(65, 'a') + "\"", &why), 7u);
    EXPECT_EQ(why, "string longer than 64 bytes");
}

TEST(ConditionParse, TypeErrorsPointAtTheValue) {
    std::string why;
    EXPECT_EQ(error_at("duration > 1000", &why), 11u);
    EXPECT_EQ(why, "duration compares with a time such as 2ms, 500us, 10ns or 1s");
    EXPECT_EQ(error_at("n > 2ms"), 0u);
    EXPECT_EQ(error_at("n == \"x\"", &why), 0u);
    EXPECT_EQ(why, "'n' is not a char*: it cannot equal a string");
    EXPECT_EQ(error_at("key < \"x\"", &why), 4u);
    EXPECT_EQ(why, "strings compare only with == or !=");
    EXPECT_EQ(error_at("x == 1", &why), 0u);
    EXPECT_EQ(why, "'x' (double) is not passed in an integer register");
    EXPECT_EQ(error_at("m == 1", &why), 0u);
    EXPECT_EQ(why, "no parameter 'm'");
    EXPECT_EQ(error_at("(n == 1) < 2"), 9u);
}

TEST(ConditionParse, CaretMessageShowsTheExpression) {
    try {
        (void)Condition::parse("n == 10 &&");
        FAIL();
    } catch (const ConditionError& e) {
        EXPECT_STREQ(e.what(), "--when: expected a value\n  n == 10 &&\n            ^");
    }
}

TEST(ConditionParse, NamesAndTiming) {
    const Condition c = Condition::parse("n == 10 && (key == \"a\" || arg3 > 0) && !(len < 5)");
    EXPECT_EQ(c.parameter_names(), (std::vector<std::string>{"n", "key", "len"}));
    EXPECT_FALSE(c.at_exit());
    EXPECT_TRUE(Condition::parse("retval < 0").at_exit());
    EXPECT_TRUE(Condition::parse("n == 1 || duration > 1us").at_exit());
    ConditionSignature none;
    none.parameters = {{"a", "int", 0, 4, true, false}};
    EXPECT_EQ(unknown_name(c, none), "n");
    EXPECT_EQ(unknown_name(Condition::parse("arg0 == 1 && retval > duration"), none), std::nullopt);
}

TEST(ConditionCompile, BytecodeIsPostfixAndTyped) {
    const iprobe_cond_program p = Condition::parse("n == -3 && small > 200").compile(fib_like());
    ASSERT_EQ(p.op_count, 7u);
    EXPECT_EQ(p.needs, IPROBE_COND_NEEDS_ARGS);
    EXPECT_EQ(p.ops[0].opcode, IPROBE_COND_ARG);
    EXPECT_EQ(p.ops[0].operand, 0);
    EXPECT_EQ(p.ops[0].width, 4);
    EXPECT_EQ(p.ops[0].is_signed, 1);
    EXPECT_EQ(p.ops[1].opcode, IPROBE_COND_CONST);
    EXPECT_EQ(p.ops[1].operand, -3);
    EXPECT_EQ(p.ops[2].opcode, IPROBE_COND_COMPARE);
    EXPECT_EQ(p.ops[2].compare, IPROBE_COND_EQ);
    EXPECT_EQ(p.ops[2].is_signed, 1);
    EXPECT_EQ(p.ops[3].operand, 3);
    EXPECT_EQ(p.ops[3].width, 1);
    EXPECT_EQ(p.ops[5].is_signed, 0) << "unsigned char against a constant compares unsigned";
    EXPECT_EQ(p.ops[6].opcode, IPROBE_COND_AND);
}

TEST(ConditionCompile, TooLongIsRefused) {
    std::string text = "n == 0";
    for (int i = 1; i < 12; i++) text += " || n == " + std::to_string(i);
    std::string why;
    try {
        (void)Condition::parse(text).compile(fib_like());
        FAIL();
    } catch (const ConditionError& e) {
        EXPECT_EQ(e.reason(), "expression too long (at most 32 operations)");
    }
}

TEST(ConditionCompile, DurationsBecomeTicks) {
    iprobe_cond_program p = Condition::parse("duration >= 2ms").compile(fib_like());
    ASSERT_EQ(p.op_count, 3u);
    EXPECT_EQ(p.ops[1].operand, 2000000);
    EXPECT_EQ(p.ops[1].is_duration, 1);
    convert_durations(p, 3000000000ull);  // 3 GHz
    EXPECT_EQ(p.ops[1].operand, 6000000);
    EXPECT_EQ(p.ops[1].is_duration, 0);
    EXPECT_EQ(p.ops[2].is_signed, 0);
    EXPECT_EQ(p.needs, IPROBE_COND_NEEDS_DURATION);
    EXPECT_EQ(parse_duration_ns("500us"), 500000u);
    EXPECT_EQ(parse_duration_ns("1s"), 1000000000u);
    EXPECT_EQ(parse_duration_ns("10ns"), 10u);
    EXPECT_EQ(parse_duration_ns("10"), std::nullopt);
    EXPECT_EQ(parse_duration_ns("-1ms"), std::nullopt);
}

TEST(ConditionCompile, MinDurationJoinsWhen) {
    const Condition c = Condition::both(Condition::parse("n == 1"), Condition::min_duration("5us"));
    EXPECT_EQ(c.text(), "(n == 1) && (duration >= 5us)");
    EXPECT_TRUE(c.at_exit());
    EXPECT_THROW(Condition::min_duration("5"), ConditionError);
    EXPECT_TRUE(Condition::both(Condition(), Condition()).empty());
}

TEST(ConditionEvaluate, IntegersSignedAndUnsigned) {
    EXPECT_TRUE(holds("n == 10", {10}));
    EXPECT_FALSE(holds("n == 10", {11}));
    // n is an int: only the low 32 bits count, sign-extended
    EXPECT_TRUE(holds("n == -1", {0xffffffffull}));
    EXPECT_TRUE(holds("n < 0", {0x12345678ffffffffull}));
    EXPECT_FALSE(holds("len < 0", {0, 0, ~0ull})) << "unsigned long is never below 0";
    EXPECT_TRUE(holds("len > 4096", {0, 0, ~0ull}));
    EXPECT_TRUE(holds("arg2 < 0", {0, 0, ~0ull})) << "raw registers are signed 64-bit";
    EXPECT_TRUE(holds("small == 0xff", {0, 0, 0, 0x1ff}));
    EXPECT_TRUE(holds("n >= 3 && n <= 3 && !(n != 3)", {3}));
    EXPECT_TRUE(holds("n == 1 || n == 2", {2}));
    EXPECT_FALSE(holds("n == 1 || n == 2", {4}));
    EXPECT_TRUE(holds("n", {7})) << "a bare value holds when not 0";
    EXPECT_FALSE(holds("!n", {7}));
    EXPECT_TRUE(holds("retval < 0 && n == 1", Values({1}, static_cast<std::uint64_t>(-5))));
    EXPECT_TRUE(holds("retval == -1", Values({}, 0xffffffffffffffffull)));
}

TEST(ConditionEvaluate, Durations) {
    iprobe_cond_program p = Condition::parse("duration > 1us && duration <= 2us").compile(fib_like());
    convert_durations(p, 1000000000ull);  // 1 tick = 1 ns
    EXPECT_EQ(evaluate(p, Values({}, 0, 1000)), 0);
    EXPECT_EQ(evaluate(p, Values({}, 0, 1001)), 1);
    EXPECT_EQ(evaluate(p, Values({}, 0, 2000)), 1);
    EXPECT_EQ(evaluate(p, Values({}, 0, 2001)), 0);
}

TEST(ConditionEvaluate, StringsNeverFault) {
    const char* good = "user:42";
    const char* longer = "user:421";
    const auto at = [](const char* s) { return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(s)); };
    EXPECT_TRUE(holds("key == \"user:42\"", {0, at(good)}));
    EXPECT_FALSE(holds("key == \"user:42\"", {0, at(longer)}));
    EXPECT_TRUE(holds("key != \"user:42\"", {0, at(longer)}));
    EXPECT_FALSE(holds("key == \"user:42\"", {0, 0})) << "NULL";
    EXPECT_TRUE(holds("key != \"user:42\"", {0, 0})) << "NULL is not the string";
    EXPECT_FALSE(holds("key == \"user:42\"", {0, 8})) << "dangling";
    // A string ending right before an unmapped page: read up to it, never past.
    const long page = ::sysconf(_SC_PAGESIZE);
    char* two = static_cast<char*>(::mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    ASSERT_NE(two, MAP_FAILED);
    ASSERT_EQ(::munmap(two + page, page), 0);
    char* end = two + page - 8;
    std::memcpy(end, "user:42", 8);
    EXPECT_TRUE(holds("key == \"user:42\"", {0, at(end)}));
    std::memcpy(end, "user:420", 8);  // no NUL before the hole
    EXPECT_FALSE(holds("key == \"user:42\"", {0, at(end)}));
    EXPECT_FALSE(holds("key == \"user:4200\"", {0, at(end)}));
    EXPECT_TRUE(holds("arg1 == \"\"", {0, at("")}));
    ::munmap(two, page);
}

// The fast form (the runtime's assembler entry) agrees with the evaluator for
// every comparison, width and signedness, at the edges of each range.
TEST(ConditionEvaluate, FastFormAgreesWithTheEvaluator) {
    const auto fast_holds = [](const iprobe_cond_program& p, std::uint64_t arg) {
        std::uint64_t x = ((arg & p.fast_mask) ^ p.fast_signbit) - p.fast_signbit;
        return (((x ^ p.fast_bias) - p.fast_low <= p.fast_span) ? 1 : 0) != p.fast_invert;
    };
    ConditionSignature s;
    s.has_dwarf = true;
    s.parameters = {{"c", "signed char", 0, 1, true, false},  {"uc", "unsigned char", 1, 1, false, false},
                    {"i", "int", 2, 4, true, false},          {"u", "unsigned int", 3, 4, false, false},
                    {"l", "long", 4, 8, true, false},         {"ul", "unsigned long", 5, 8, false, false}};
    const std::vector<std::string> constants = {"0", "1", "-1", "127", "-128", "255", "2147483647", "-2147483648",
                                                "4294967295", "0x7fffffffffffffff", "-9223372036854775808", "0xffffffffffffffff"};
    const std::vector<std::uint64_t> values = {0, 1, 2, 0x7f, 0x80, 0xff, 0x100, 0x7fffffff, 0x80000000, 0xffffffff,
                                               0x100000000ull, 0x7fffffffffffffffull, 0x8000000000000000ull,
                                               0xfffffffffffffffeull, 0xffffffffffffffffull, 0x12345678ffffff80ull};
    int checked = 0;
    for (const char* name : {"c", "uc", "i", "u", "l", "ul"})
        for (const char* op : {"==", "!=", "<", "<=", ">", ">="})
            for (const auto& c : constants) {
                const std::string text = std::string(name) + " " + op + " " + c;
                const iprobe_cond_program p = Condition::parse(text).compile(s);
                ASSERT_EQ(p.fast, 1) << text;
                for (std::uint64_t v : values) {
                    iprobe_cond_values in{};
                    for (auto& a : in.args) a = v;
                    ASSERT_EQ(fast_holds(p, v), iprobe_cond_evaluate(&p, &in) == 1) << text << " at " << v;
                    checked++;
                }
            }
    EXPECT_EQ(checked, 6 * 6 * 12 * 16);
    EXPECT_EQ(Condition::parse("i == 1 && u == 2").compile(s).fast, 0);
    EXPECT_EQ(Condition::parse("retval == 1").compile(s).fast, 0);
}

TEST(ConditionEvaluate, MalformedProgramsAreFalseNeverACrash) {
    iprobe_cond_program p{};
    iprobe_cond_values v{};
    EXPECT_EQ(iprobe_cond_evaluate(&p, &v), 1) << "empty: no condition";
    p.op_count = IPROBE_COND_MAX_OPS + 1;
    EXPECT_EQ(iprobe_cond_evaluate(&p, &v), 0);
    p.op_count = 1;
    p.ops[0] = {IPROBE_COND_AND, 0, 0, 0, 0, {}, 0};  // stack underflow
    EXPECT_EQ(iprobe_cond_evaluate(&p, &v), 0);
    p.ops[0] = {IPROBE_COND_ARG, 0, 8, 0, 0, {}, 6};  // no such register
    EXPECT_EQ(iprobe_cond_evaluate(&p, &v), 0);
    p.ops[0] = {200, 0, 0, 0, 0, {}, 0};
    EXPECT_EQ(iprobe_cond_evaluate(&p, &v), 0);
    p.op_count = 2;
    p.ops[0] = {IPROBE_COND_CONST, 0, 8, 0, 0, {}, 1};
    p.ops[1] = {IPROBE_COND_STRING_EQ, 0, 0, 0, 0, {}, 3};  // string 3 of 0
    EXPECT_EQ(iprobe_cond_evaluate(&p, &v), 0);
    p.string_count = 4;
    p.strings[3].length = 1000;
    EXPECT_EQ(iprobe_cond_evaluate(&p, &v), 0);
    p.ops[1] = {IPROBE_COND_COMPARE, 9, 0, 0, 0, {}, 0};
    EXPECT_EQ(iprobe_cond_evaluate(&p, &v), 0);
    // Every op a push: the stack is as deep as the program is long, no deeper.
    p.op_count = IPROBE_COND_MAX_OPS;
    for (auto& op : p.ops) op = {IPROBE_COND_CONST, 0, 8, 0, 0, {}, 1};
    EXPECT_EQ(iprobe_cond_evaluate(&p, &v), 0) << "more than one value left";
}

}  // namespace
}  // namespace iprobe::hotpatch
