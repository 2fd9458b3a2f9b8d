// `--when EXPR` and `--min-duration TIME`: the condition language, parsed
// once, then compiled per function (against its DWARF parameters) into the
// bounded bytecode the runtime evaluates in the target
// (iprobe/formats/condition.h).
//
//   expr    := and ('||' and)*
//   and     := unary ('&&' unary)*
//   unary   := '!' unary | compare
//   compare := operand (('=='|'!='|'<'|'<='|'>'|'>=') operand)?   (a bare operand: != 0)
//   operand := '(' expr ')' | NAME | arg0..arg5 | retval | duration
//            | INTEGER (decimal or 0x hex, optionally negative)
//            | DURATION (INTEGER with ns, us, ms or s) | "STRING" (\" \\ escapes, at most 64 bytes)
//
// A string compares (== or != only) with a `char *` parameter or a raw
// argN, read in the target at most 65 bytes, never faulting.  `duration`
// compares only with a DURATION.  Comparisons are signed when the value's
// DWARF type is (raw argN and retval without DWARF: signed 64-bit).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "iprobe/formats/condition.h"
#include "iprobe/support/error.h"

namespace iprobe::hotpatch {

// One parameter of a function as a condition can use it.
struct ConditionParameter {
    std::string name;
    std::string type;        // as DWARF spells it ("int", "const char*")
    int register_index = -1; // integer argument register 0..5, -1: not in one (float, large struct, 7th+)
    unsigned size = 8;       // bytes of the value in its register
    bool is_signed = false;
    bool is_string = false;  // char* (any constness)
    bool optimized_out = false;  // not where a -finstrument-functions site can read it
};

// What a function offers a condition: its named parameters and return type
// from DWARF, or nothing but raw registers without it.
struct ConditionSignature {
    bool has_dwarf = false;
    std::vector<ConditionParameter> parameters;
    ConditionParameter retval{"retval", "long", 0, 8, true, false};  // register_index unused
    bool returns_value = true;  // false: void
};

// A syntax or type error in EXPR: the message, then EXPR, then a caret under
// `position` (ExitCode::bad_input).
class ConditionError : public Error {
public:
    ConditionError(const std::string& reason, std::string_view text, std::size_t position);
    std::size_t position() const { return position_; }
    const std::string& reason() const { return reason_; }

private:
    std::string reason_;
    std::size_t position_;
};

class Condition {
public:
    struct Node;
    // Throws ConditionError.
    static Condition parse(std::string_view text);
    // `duration >= TIME` for --min-duration TIME ("2ms", "500us"); throws ConditionError.
    static Condition min_duration(std::string_view time);
    // Both must hold (--when and --min-duration together); either may be empty.
    static Condition both(Condition a, Condition b);

    Condition();
    Condition(Condition&&) noexcept;
    Condition& operator=(Condition&&) noexcept;
    ~Condition();

    bool empty() const { return !root_; }
    const std::string& text() const { return text_; }
    // Names it uses that must be a function's parameters (not argN, retval, duration).
    std::vector<std::string> parameter_names() const;
    // Decided at exit (reads retval or duration), else at entry.
    bool at_exit() const;

    // The bytecode for one function, durations still in ns
    // (is_duration constants; convert_durations() before writing it).
    // Throws ConditionError when the function lacks a name EXPR uses or a
    // value has the wrong kind for its comparison; unknown_name() tells the
    // first case apart.
    iprobe_cond_program compile(const ConditionSignature& signature) const;

private:
    std::string text_;
    std::shared_ptr<const Node> root_;
};

// The first parameter name `condition` uses that `signature` lacks, if any.
std::optional<std::string> unknown_name(const Condition& condition, const ConditionSignature& signature);

// Turns the program's ns constants into clock ticks (`ticks_per_second`:
// the region's tsc_hz), rounding to nearest.
void convert_durations(iprobe_cond_program& program, std::uint64_t ticks_per_second);

// "2ms", "500us", "10ns", "1s" -> ns; nullopt when not a duration (a unit is required).
std::optional<std::uint64_t> parse_duration_ns(std::string_view text);

}  // namespace iprobe::hotpatch
