// `iprobe patch` (patch_cmd.cpp) and the patched functions in `iprobe status`.
#pragma once

#include <ostream>
#include <vector>

#include "iprobe/hotpatch/live_patch.h"
#include "iprobe/support/json.h"

namespace iprobe::hotpatch {

int run_patch(int argc, char** argv);
void write_patches_json(JsonWriter& j, const std::vector<PatchedFunction>& patches);
void print_patches(std::ostream& out, const std::vector<PatchedFunction>& patches);

}  // namespace iprobe::hotpatch
