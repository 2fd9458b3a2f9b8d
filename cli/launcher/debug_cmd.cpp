#include "commands.h"
#include "iprobe/support/error.h"

namespace iprobe::launcher::cli {

int debug_main(const std::vector<std::string>&) {
    throw Error("iprobe debug: not built yet", ExitCode::unavailable);
}

}  // namespace iprobe::launcher::cli
