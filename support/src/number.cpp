#include "iprobe/support/number.h"

#include <charconv>
#include <cmath>
#include <string>

#include "iprobe/support/error.h"

namespace iprobe {

namespace {

constexpr std::uint64_t kPidMaxLimit = 4194304;  // PID_MAX_LIMIT on 64-bit kernels

[[noreturn]] void bad(std::string_view what, std::string_view text, const std::string& expected) {
    throw Error(std::string(what) + " must be " + expected + ", not '" + std::string(text) + "'", ExitCode::usage);
}

std::string range(double min, double max) {
    auto show = [](double v) {
        std::string s = std::to_string(v);
        s.erase(s.find_last_not_of('0') + 1);
        if (!s.empty() && s.back() == '.') s.pop_back();
        return s;
    };
    return show(min) + " to " + show(max);
}

}  // namespace

std::optional<std::uint64_t> parse_unsigned(std::string_view text, std::uint64_t min, std::uint64_t max) {
    if (text.empty() || text.size() > 20) return std::nullopt;
    for (char c : text)
        if (c < '0' || c > '9') return std::nullopt;
    std::uint64_t v = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v, 10);
    if (ec != std::errc{} || end != text.data() + text.size() || v < min || v > max) return std::nullopt;
    return v;
}

std::uint64_t parse_unsigned_or_usage(std::string_view text, std::string_view what, std::uint64_t min,
                                      std::uint64_t max) {
    if (auto v = parse_unsigned(text, min, max)) return *v;
    bad(what, text, "a whole number from " + std::to_string(min) + " to " + std::to_string(max));
}

double parse_decimal_or_usage(std::string_view text, std::string_view what, double min, double max) {
    double v = 0;
    const bool plain = !text.empty() && text.find_first_not_of("0123456789.eE+-") == std::string_view::npos;
    const auto [end, ec] = plain ? std::from_chars(text.data(), text.data() + text.size(), v)
                                 : std::from_chars_result{text.data(), std::errc::invalid_argument};
    if (ec != std::errc{} || end != text.data() + text.size() || !std::isfinite(v) || v < min || v > max)
        bad(what, text, "a number from " + range(min, max));
    return v;
}

std::uint64_t parse_size_or_usage(std::string_view text, std::string_view what) {
    std::size_t digits = 0;
    while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
    const std::string_view suffix = text.substr(digits);
    std::uint64_t scale = 0;
    if (suffix.empty() || suffix == "B") scale = 1;
    else if (suffix == "K" || suffix == "k" || suffix == "KiB") scale = std::uint64_t(1) << 10;
    else if (suffix == "M" || suffix == "m" || suffix == "MiB") scale = std::uint64_t(1) << 20;
    else if (suffix == "G" || suffix == "g" || suffix == "GiB") scale = std::uint64_t(1) << 30;
    constexpr std::uint64_t kMax = std::uint64_t(1) << 40;
    const auto n = scale ? parse_unsigned(text.substr(0, digits), 1, kMax / scale) : std::nullopt;
    if (!n) bad(what, text, "a size such as 65536, 64K, 4M or 1G (at most 1T)");
    return *n * scale;
}

pid_t parse_pid_or_usage(std::string_view text, std::string_view what) {
    if (auto v = parse_unsigned(text, 1, kPidMaxLimit)) return static_cast<pid_t>(*v);
    bad(what, text, "a process ID (1 to " + std::to_string(kPidMaxLimit) + ")");
}

}  // namespace iprobe
