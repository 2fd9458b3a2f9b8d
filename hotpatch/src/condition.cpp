#include "iprobe/hotpatch/condition.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstring>
#include <limits>
#include <set>

namespace iprobe::hotpatch {

namespace {

std::string caret_message(const std::string& reason, std::string_view text, std::size_t position) {
    const std::string option = reason.rfind("--", 0) == 0 ? "" : "--when: ";  // --min-duration names itself
    return option + reason + "\n  " + std::string(text) + "\n  " + std::string(position, ' ') + "^";
}

}  // namespace

ConditionError::ConditionError(const std::string& reason, std::string_view text, std::size_t position)
    : Error(caret_message(reason, text, position), ExitCode::bad_input), reason_(reason), position_(position) {}

struct Condition::Node {
    enum class Kind { name, arg, retval, duration, integer, duration_literal, string, compare, not_, and_, or_ };
    Kind kind;
    std::size_t position = 0;
    std::string text;         // name, string bytes
    std::int64_t value = 0;   // integer, ns, arg index
    iprobe_cond_compare compare = IPROBE_COND_EQ;
    std::shared_ptr<const Node> left, right;
};

namespace {

using Node = Condition::Node;
using NodePtr = std::shared_ptr<const Node>;

std::shared_ptr<Node> make_node(Node::Kind kind, std::size_t position, std::string text = {}) {
    auto n = std::make_shared<Node>();
    n->kind = kind;
    n->position = position;
    n->text = std::move(text);
    return n;
}

std::optional<std::uint64_t> duration_units(std::string_view unit) {
    if (unit == "ns") return 1;
    if (unit == "us") return 1000;
    if (unit == "ms") return 1000000;
    if (unit == "s") return 1000000000;
    return std::nullopt;
}

class Parser {
public:
    explicit Parser(std::string_view text) : text_(text) {}

    NodePtr parse() {
        skip_space();
        if (at_ >= text_.size()) fail("empty expression", at_);
        NodePtr e = expression();
        skip_space();
        if (at_ < text_.size())
            fail(text_[at_] == '=' ? "'=' is no comparison: use ==" : "unexpected '" + std::string(1, text_[at_]) + "'", at_);
        return e;
    }

    [[noreturn]] void fail(const std::string& reason, std::size_t position) const {
        throw ConditionError(reason, text_, position);
    }

private:
    void skip_space() {
        while (at_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[at_]))) at_++;
    }
    bool take(std::string_view token) {
        skip_space();
        if (text_.substr(at_, token.size()) != token) return false;
        at_ += token.size();
        return true;
    }
    static NodePtr binary(Node::Kind kind, NodePtr l, NodePtr r, std::size_t position) {
        auto n = make_node(kind, position);
        n->left = std::move(l);
        n->right = std::move(r);
        return n;
    }

    // operand (token operand)*, left-associative.
    NodePtr chain(std::string_view token, Node::Kind kind, NodePtr (Parser::*operand)()) {
        NodePtr l = (this->*operand)();
        for (;;) {
            skip_space();
            const std::size_t p = at_;
            if (!take(token)) return l;
            l = binary(kind, l, (this->*operand)(), p);
        }
    }
    NodePtr expression() { return chain("||", Node::Kind::or_, &Parser::conjunction); }
    NodePtr conjunction() { return chain("&&", Node::Kind::and_, &Parser::unary); }
    NodePtr unary() {
        skip_space();
        const std::size_t p = at_;
        if (at_ < text_.size() && text_[at_] == '!' && text_.substr(at_, 2) != "!=") {
            at_++;
            return binary(Node::Kind::not_, unary(), nullptr, p);
        }
        return comparison();
    }
    NodePtr comparison() {
        NodePtr l = operand();
        skip_space();
        const std::size_t p = at_;
        static const std::pair<std::string_view, iprobe_cond_compare> ops[] = {
            {"==", IPROBE_COND_EQ}, {"!=", IPROBE_COND_NE}, {"<=", IPROBE_COND_LE},
            {">=", IPROBE_COND_GE}, {"<", IPROBE_COND_LT},  {">", IPROBE_COND_GT}};
        for (const auto& [token, compare] : ops) {
            if (!take(token)) continue;
            auto n = make_node(Node::Kind::compare, p);
            n->compare = compare;
            n->left = l;
            n->right = operand();
            return n;
        }
        return l;
    }
    NodePtr operand() {
        skip_space();
        const std::size_t p = at_;
        if (at_ >= text_.size()) fail("expected a value", p);
        const char c = text_[at_];
        if (c == '(') {
            at_++;
            NodePtr e = expression();
            skip_space();
            if (!take(")")) fail("expected ')' to close the '(' at column " + std::to_string(p + 1), at_);
            return e;
        }
        if (c == '"') return string_literal();
        if (std::isdigit(static_cast<unsigned char>(c)) || c == '-') return number();
        if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') return identifier();
        fail("expected a value (a parameter, argN, retval, duration, a number or a \"string\")", p);
    }
    NodePtr identifier() {
        const std::size_t p = at_;
        while (at_ < text_.size() && (std::isalnum(static_cast<unsigned char>(text_[at_])) || text_[at_] == '_')) at_++;
        const std::string name(text_.substr(p, at_ - p));
        auto n = make_node(Node::Kind::name, p, name);
        if (name == "retval") n->kind = Node::Kind::retval;
        else if (name == "duration") n->kind = Node::Kind::duration;
        else if (name.size() == 4 && name.starts_with("arg") && name[3] >= '0' && name[3] <= '9') {
            if (name[3] > '5') fail("only arg0..arg5 (the integer argument registers) can be read", p);
            n->kind = Node::Kind::arg;
            n->value = name[3] - '0';
        }
        return n;
    }
    NodePtr number() {
        const std::size_t p = at_;
        const bool negative = text_[at_] == '-';
        if (negative) at_++;
        const bool hex = text_.substr(at_, 2) == "0x" || text_.substr(at_, 2) == "0X";
        if (hex) at_ += 2;
        const std::size_t digits = at_;
        while (at_ < text_.size() && std::isxdigit(static_cast<unsigned char>(text_[at_])) &&
               (hex || std::isdigit(static_cast<unsigned char>(text_[at_]))))
            at_++;
        if (at_ == digits) fail(negative ? "expected a number after '-'" : "expected hex digits after 0x", at_);
        std::uint64_t magnitude = 0;
        const auto r = std::from_chars(text_.data() + digits, text_.data() + at_, magnitude, hex ? 16 : 10);
        if (r.ec != std::errc{}) fail("number out of range (64 bits)", p);
        const std::size_t unit_at = at_;
        while (at_ < text_.size() && std::isalpha(static_cast<unsigned char>(text_[at_]))) at_++;
        const std::string_view unit = text_.substr(unit_at, at_ - unit_at);
        auto n = make_node(Node::Kind::integer, p);
        if (!unit.empty()) {
            const auto scale = duration_units(unit);
            if (!scale || hex) fail("unknown unit '" + std::string(unit) + "' (durations take ns, us, ms or s)", unit_at);
            if (negative) fail("a duration cannot be negative", p);
            if (magnitude > std::numeric_limits<std::uint64_t>::max() / *scale / 1000)  // room for the tick conversion
                fail("duration out of range", p);
            n->kind = Node::Kind::duration_literal;
            n->value = static_cast<std::int64_t>(magnitude * *scale);
            return n;
        }
        if (negative) {
            if (magnitude > std::uint64_t{1} << 63) fail("number out of range (64 bits)", p);
            n->value = static_cast<std::int64_t>(0 - magnitude);
        } else {
            n->value = static_cast<std::int64_t>(magnitude);
        }
        return n;
    }
    NodePtr string_literal() {
        const std::size_t p = at_++;
        std::string bytes;
        for (;;) {
            if (at_ >= text_.size()) fail("unterminated string", p);
            char c = text_[at_++];
            if (c == '"') break;
            if (c == '\\') {
                if (at_ >= text_.size()) fail("unterminated string", p);
                c = text_[at_++];
                if (c == 'n') c = '\n';
                else if (c == 't') c = '\t';
                else if (c != '"' && c != '\\') fail("unknown escape (\\\", \\\\, \\n, \\t)", at_ - 2);
            }
            bytes.push_back(c);
        }
        if (bytes.size() > IPROBE_COND_STRING_MAX)
            fail("string longer than " + std::to_string(IPROBE_COND_STRING_MAX) + " bytes", p);
        if (bytes.find('\0') != std::string::npos) fail("a string cannot hold a NUL byte", p);
        return make_node(Node::Kind::string, p, bytes);
    }

    std::string_view text_;
    std::size_t at_ = 0;
};

void collect_names(const Node* n, std::vector<std::string>& out) {
    if (!n) return;
    if (n->kind == Node::Kind::name && std::find(out.begin(), out.end(), n->text) == out.end()) out.push_back(n->text);
    collect_names(n->left.get(), out);
    collect_names(n->right.get(), out);
}

bool reads_at_exit(const Node* n) {
    if (!n) return false;
    if (n->kind == Node::Kind::retval || n->kind == Node::Kind::duration) return true;
    return reads_at_exit(n->left.get()) || reads_at_exit(n->right.get());
}

const ConditionParameter* find_parameter(const ConditionSignature& s, const std::string& name) {
    for (const auto& p : s.parameters)
        if (p.name == name) return &p;
    return nullptr;
}

// What an operand is, for type checks.
enum class ValueKind { integer, string_pointer, duration, duration_literal, string_literal, boolean };

class Compiler {
public:
    Compiler(const ConditionSignature& s, std::string_view text) : s_(s), text_(text) {}

    iprobe_cond_program run(const Node* root) {
        const ValueKind k = emit(root);
        if (k != ValueKind::boolean) truthy(root, k);
        fill_fast(program_);
        return program_;
    }

    // `argN OP constant` as the one range test of the runtime's assembler
    // entry (condition.h): the set of 64-bit values, after the extension and
    // the bias, that hold is an interval (or, for !=, all but one value).
    static void fill_fast(iprobe_cond_program& p) {
        const iprobe_cond_op* op = p.ops;
        if (p.op_count != 3 || op[0].opcode != IPROBE_COND_ARG || op[1].opcode != IPROBE_COND_CONST ||
            op[2].opcode != IPROBE_COND_COMPARE || op[0].operand < 0 || op[0].operand >= IPROBE_COND_ARGS)
            return;
        const unsigned bits = op[0].width >= 1 && op[0].width < 8 ? op[0].width * 8u : 64u;
        p.fast_mask = bits == 64 ? ~0ull : (1ull << bits) - 1;
        p.fast_signbit = op[0].is_signed && bits < 64 ? 1ull << (bits - 1) : 0;
        p.fast_bias = op[2].is_signed ? 1ull << 63 : 0;
        const std::uint64_t c = static_cast<std::uint64_t>(op[1].operand) ^ p.fast_bias;
        constexpr std::uint64_t kMax = ~0ull;
        auto range = [&](std::uint64_t low, std::uint64_t high) { p.fast_low = low, p.fast_span = high - low; };
        auto never = [&] { range(0, kMax), p.fast_invert = 1; };
        switch (op[2].compare) {
        case IPROBE_COND_EQ: range(c, c); break;
        case IPROBE_COND_NE: range(c, c), p.fast_invert = 1; break;
        case IPROBE_COND_LT: c == 0 ? never() : range(0, c - 1); break;
        case IPROBE_COND_LE: range(0, c); break;
        case IPROBE_COND_GT: c == kMax ? never() : range(c + 1, kMax); break;
        case IPROBE_COND_GE: range(c, kMax); break;
        default: return;
        }
        p.fast_arg = static_cast<std::uint8_t>(op[0].operand);
        p.fast = 1;
    }

private:
    [[noreturn]] void fail(const std::string& reason, std::size_t position) const {
        throw ConditionError(reason, text_, position);
    }
    void push(iprobe_cond_op op, std::size_t position) {
        if (program_.op_count >= IPROBE_COND_MAX_OPS)
            fail("expression too long (at most " + std::to_string(IPROBE_COND_MAX_OPS) + " operations)", position);
        program_.ops[program_.op_count++] = op;
    }
    void truthy(const Node* n, ValueKind k) {
        if (k == ValueKind::string_literal || k == ValueKind::duration_literal || k == ValueKind::duration)
            fail("a condition needs a comparison here", n->position);
        push({IPROBE_COND_CONST, 0, 0, 0, 0, {}, 0}, n->position);
        push({IPROBE_COND_COMPARE, IPROBE_COND_NE, 0, 0, 0, {}, 0}, n->position);
    }
    // Emits the value of a leaf (or the truth of a sub-expression); its kind.
    ValueKind emit(const Node* n) {
        switch (n->kind) {
        case Node::Kind::integer: push({IPROBE_COND_CONST, 0, 8, 1, 0, {}, n->value}, n->position); return ValueKind::integer;
        case Node::Kind::duration_literal:
            push({IPROBE_COND_CONST, 0, 8, 0, 1, {}, n->value}, n->position);
            return ValueKind::duration_literal;
        case Node::Kind::duration:
            program_.needs |= IPROBE_COND_NEEDS_DURATION;
            push({IPROBE_COND_DURATION, 0, 8, 0, 0, {}, 0}, n->position);
            return ValueKind::duration;
        case Node::Kind::retval:
            if (!s_.returns_value) fail("the function returns nothing (void): no retval", n->position);
            program_.needs |= IPROBE_COND_NEEDS_RETVAL;
            push({IPROBE_COND_RETVAL, 0, static_cast<std::uint8_t>(s_.retval.size), s_.retval.is_signed, 0, {}, 0},
                 n->position);
            last_signed_ = s_.retval.is_signed;
            return s_.retval.is_string ? ValueKind::string_pointer : ValueKind::integer;
        case Node::Kind::arg:
            program_.needs |= IPROBE_COND_NEEDS_ARGS;
            push({IPROBE_COND_ARG, 0, 8, 1, 0, {}, n->value}, n->position);
            last_signed_ = true;
            return ValueKind::string_pointer;  // raw: an integer or a pointer
        case Node::Kind::name: {
            const ConditionParameter* p = find_parameter(s_, n->text);
            if (!p) fail("no parameter '" + n->text + "'", n->position);
            if (p->optimized_out)
                fail("'" + n->text + "' is optimized out at the -finstrument-functions site (after the prologue; "
                     "the entry or LLVM flow has it)",
                     n->position);
            if (p->register_index < 0)
                fail("'" + n->text + "' (" + p->type + ") is not passed in an integer register", n->position);
            program_.needs |= IPROBE_COND_NEEDS_ARGS;
            push({IPROBE_COND_ARG, 0, static_cast<std::uint8_t>(p->size), p->is_signed, 0, {}, p->register_index},
                 n->position);
            last_signed_ = p->is_signed;
            return p->is_string ? ValueKind::string_pointer : ValueKind::integer;
        }
        case Node::Kind::string: fail("a string compares only with == or != against a char* parameter", n->position);
        case Node::Kind::not_: {
            const ValueKind k = emit(n->left.get());
            if (k != ValueKind::boolean) truthy(n->left.get(), k);
            push({IPROBE_COND_NOT, 0, 0, 0, 0, {}, 0}, n->position);
            return ValueKind::boolean;
        }
        case Node::Kind::and_:
        case Node::Kind::or_: {
            for (const Node* side : {n->left.get(), n->right.get()}) {
                const ValueKind k = emit(side);
                if (k != ValueKind::boolean) truthy(side, k);
            }
            push({static_cast<std::uint8_t>(n->kind == Node::Kind::and_ ? IPROBE_COND_AND : IPROBE_COND_OR), 0, 0, 0, 0,
                  {}, 0},
                 n->position);
            return ValueKind::boolean;
        }
        case Node::Kind::compare: return compare(n);
        }
        fail("internal: unknown node", n->position);
    }
    ValueKind compare(const Node* n) {
        const Node* l = n->left.get();
        const Node* r = n->right.get();
        if (r->kind == Node::Kind::string || l->kind == Node::Kind::string) {
            const Node* str = r->kind == Node::Kind::string ? r : l;
            const Node* other = str == r ? l : r;
            if (other->kind == Node::Kind::string) fail("compare a char* parameter with a string", other->position);
            if (n->compare != IPROBE_COND_EQ && n->compare != IPROBE_COND_NE)
                fail("strings compare only with == or !=", n->position);
            if (emit(other) != ValueKind::string_pointer)
                fail("'" + other->text + "' is not a char*: it cannot equal a string", other->position);
            if (program_.string_count >= IPROBE_COND_MAX_STRINGS)
                fail("at most " + std::to_string(IPROBE_COND_MAX_STRINGS) + " strings", str->position);
            iprobe_cond_string& s = program_.strings[program_.string_count];
            s.length = static_cast<std::uint32_t>(str->text.size());
            std::memcpy(s.bytes, str->text.data(), str->text.size());
            push({IPROBE_COND_STRING_EQ, 0, 0, 0, 0, {}, program_.string_count++}, n->position);
            if (n->compare == IPROBE_COND_NE) push({IPROBE_COND_NOT, 0, 0, 0, 0, {}, 0}, n->position);
            return ValueKind::boolean;
        }
        last_signed_ = true;
        const ValueKind lk = emit(l);
        const bool l_signed = last_signed_;
        last_signed_ = true;
        const ValueKind rk = emit(r);
        const bool r_signed = last_signed_;
        const auto is_duration = [](ValueKind k) { return k == ValueKind::duration || k == ValueKind::duration_literal; };
        if (is_duration(lk) != is_duration(rk)) {
            const Node* odd = is_duration(lk) ? r : l;
            fail("duration compares with a time such as 2ms, 500us, 10ns or 1s", odd->position);
        }
        if (lk == ValueKind::boolean || rk == ValueKind::boolean)
            fail("cannot order a comparison's truth; use parentheses around && and ||", n->position);
        // Unsigned when either side is (as C converts), durations always.
        const bool is_signed = !is_duration(lk) && l_signed && r_signed;
        push({IPROBE_COND_COMPARE, static_cast<std::uint8_t>(n->compare), 0, is_signed, 0, {}, 0}, n->position);
        return ValueKind::boolean;
    }

    const ConditionSignature& s_;
    std::string_view text_;
    iprobe_cond_program program_{};
    bool last_signed_ = true;
};

}  // namespace

Condition::Condition() = default;
Condition::Condition(Condition&&) noexcept = default;
Condition& Condition::operator=(Condition&&) noexcept = default;
Condition::~Condition() = default;

Condition Condition::parse(std::string_view text) {
    Condition c;
    c.text_ = std::string(text);
    c.root_ = Parser(c.text_).parse();
    return c;
}

std::optional<std::uint64_t> parse_duration_ns(std::string_view text) {
    std::size_t digits = 0;
    while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) digits++;
    const auto scale = duration_units(text.substr(digits));
    std::uint64_t magnitude = 0;
    if (digits == 0 || !scale ||
        std::from_chars(text.data(), text.data() + digits, magnitude).ec != std::errc{} ||
        magnitude > std::numeric_limits<std::uint64_t>::max() / *scale / 1000)
        return std::nullopt;
    return magnitude * *scale;
}

Condition Condition::min_duration(std::string_view time) {
    const auto ns = parse_duration_ns(time);
    if (!ns) throw ConditionError("--min-duration takes a time such as 2ms, 500us, 10ns or 1s", time, 0);
    return parse("duration >= " + std::string(time));
}

Condition Condition::both(Condition a, Condition b) {
    if (a.empty()) return b;
    if (b.empty()) return a;
    // Re-parse the joined text so positions in later errors point into what is shown.
    return parse("(" + a.text_ + ") && (" + b.text_ + ")");
}

std::vector<std::string> Condition::parameter_names() const {
    std::vector<std::string> out;
    collect_names(root_.get(), out);
    return out;
}

bool Condition::at_exit() const { return reads_at_exit(root_.get()); }

iprobe_cond_program Condition::compile(const ConditionSignature& signature) const {
    if (!root_) return iprobe_cond_program{};
    return Compiler(signature, text_).run(root_.get());
}

std::optional<std::string> unknown_name(const Condition& condition, const ConditionSignature& signature) {
    for (const auto& name : condition.parameter_names())
        if (!find_parameter(signature, name)) return name;
    return std::nullopt;
}

void convert_durations(iprobe_cond_program& program, std::uint64_t ticks_per_second) {
    const std::uint32_t n = std::min<std::uint32_t>(program.op_count, IPROBE_COND_MAX_OPS);
    for (std::uint32_t i = 0; i < n; i++) {
        iprobe_cond_op& op = program.ops[i];
        if (op.opcode != IPROBE_COND_CONST || !op.is_duration) continue;
        const unsigned __int128 ticks =
            (static_cast<unsigned __int128>(static_cast<std::uint64_t>(op.operand)) * ticks_per_second + 500000000u) /
            1000000000u;
        op.operand = static_cast<std::int64_t>(std::min<unsigned __int128>(ticks, std::numeric_limits<std::int64_t>::max()));
        op.is_duration = 0;
    }
}

}  // namespace iprobe::hotpatch
