// `iprobe patch` (patch_cmd.cpp).
#pragma once

#include <ostream>
#include <vector>

#include "iprobe/hotpatch/live_patch.h"
#include "iprobe/support/json.h"

namespace iprobe::hotpatch {

int run_patch(int argc, char** argv);

}  // namespace iprobe::hotpatch
