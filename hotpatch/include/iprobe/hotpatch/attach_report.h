// What an attach reports, as people read it and as JSON: `iprobe attach`
// writes both, and the launcher reads the JSON of the attach it runs inside a
// clone's namespaces (a child process there, not a call: the target's PID and
// files are only visible from inside).
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>

#include "iprobe/hotpatch/hotpatch.h"

namespace iprobe::hotpatch {

// "enabled N probes[ in process PID] (A already on, T on in total); ..."
std::string attach_summary(const AttachStats& stats, std::optional<pid_t> pid = std::nullopt);
std::string attach_json(const AttachStats& stats, pid_t pid);
// Throws Error(bad_input) when `json` is not an attach report.
AttachStats parse_attach_json(std::string_view json);

}  // namespace iprobe::hotpatch
