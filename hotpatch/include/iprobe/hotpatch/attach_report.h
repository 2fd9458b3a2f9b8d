// What an attach reports, as people read it (its JSON is agent_protocol.h's).
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>

#include "iprobe/hotpatch/hotpatch.h"

namespace iprobe::hotpatch {

// "enabled N probes[ in process PID] (A already on, T on in total); ..."
std::string attach_summary(const AttachStats& stats, std::optional<pid_t> pid = std::nullopt);

// The value options of a command line (`--args`, `--retval`,
// `--backtrace[=DEPTH]`, DEPTH empty for the default 8); Error(usage) for a
// DEPTH outside 1..IPROBE_RT_BACKTRACE_MAX.
ValueOptions value_options_of(bool args, bool retval, bool backtrace, const std::string& depth);

}  // namespace iprobe::hotpatch
