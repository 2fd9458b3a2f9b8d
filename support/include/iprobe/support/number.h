// Numbers from the command line, checked over their whole text and range:
// "4294967296" is not a pid, "12abc" is not 12, "99999999999" is not
// whatever it wraps to.  Each failure is Error(ExitCode::usage) naming the
// option and the range.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string_view>

namespace iprobe {

// Decimal digits only (no sign, no spaces, no base prefix), within [min, max].
std::optional<std::uint64_t> parse_unsigned(std::string_view text, std::uint64_t min = 0,
                                            std::uint64_t max = UINT64_MAX);
std::uint64_t parse_unsigned_or_usage(std::string_view text, std::string_view what, std::uint64_t min,
                                      std::uint64_t max);

// A finite decimal number within [min, max] ("1.5", "2e3"; not "inf", "nan", "0x10").
double parse_decimal_or_usage(std::string_view text, std::string_view what, double min, double max);

// A size in bytes: digits with an optional K, M or G (KiB, MiB, GiB; k, m, g)
// suffix or B, more than 0 and at most 1 TiB.
std::uint64_t parse_size_or_usage(std::string_view text, std::string_view what);

// A process ID: 1 up to the kernel's largest (PID_MAX_LIMIT, 4194304).
pid_t parse_pid_or_usage(std::string_view text, std::string_view what = "PID");

}  // namespace iprobe
