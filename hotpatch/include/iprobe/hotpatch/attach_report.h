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

}  // namespace iprobe::hotpatch
