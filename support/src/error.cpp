#include "iprobe/support/error.h"

#include <cerrno>
#include <cstring>

namespace iprobe {

void throw_errno(const std::string& what, ExitCode code) {
    const int err = errno;
    if (err == EPERM || err == EACCES) code = ExitCode::permission;
    if (err == ENOENT || err == ESRCH) code = ExitCode::not_found;
    throw Error(what + ": " + std::strerror(err), code);
}

}  // namespace iprobe
