// What an attach reports, as people read it and as JSON: `iprobe attach`
// writes both, and the launcher reads the JSON of the attach it runs inside a
// clone's namespaces (a child process there, not a call: the target's PID and
// files are only visible from inside).
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "iprobe/hotpatch/hotpatch.h"

namespace iprobe::hotpatch {

// "enabled N probes[ in process PID] (A already on, T on in total); ..."
std::string attach_summary(const AttachStats& stats, std::optional<pid_t> pid = std::nullopt);
std::string attach_json(const AttachStats& stats, pid_t pid);
// Throws Error(bad_input) when `json` is not an attach report.
AttachStats parse_attach_json(std::string_view json);

// The value options of a command line (`--args`, `--retval`,
// `--backtrace[=DEPTH]`, DEPTH empty for the default 8); Error(usage) for a
// DEPTH outside 1..IPROBE_RT_BACKTRACE_MAX.
ValueOptions value_options_of(bool args, bool retval, bool backtrace, const std::string& depth);
// And back: the options that ask `iprobe attach` for `values` (the launcher
// runs the attach inside a clone's namespaces).
std::vector<std::string> value_option_args(const ValueOptions& values);

}  // namespace iprobe::hotpatch
