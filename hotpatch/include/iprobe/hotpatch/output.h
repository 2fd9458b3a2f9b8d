// How results are written for people and programs.
#pragma once

#include <string>

#include "iprobe/hotpatch/trace_reader.h"

namespace iprobe::hotpatch {

// "SECONDS.NANOS    TID   -> function" with two spaces per open call.
std::string trace_text_line(const TraceRecord& record);

}  // namespace iprobe::hotpatch
