#include "iprobe/support/error.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace iprobe {

void throw_errno(const std::string& what, ExitCode code) {
    const int err = errno;
    if (err == EPERM || err == EACCES) code = ExitCode::permission;
    if (err == ENOENT || err == ESRCH) code = ExitCode::not_found;
    throw Error(what + ": " + std::strerror(err), code);
}

int run_reporting_errors(const std::string& who, const std::function<int()>& body) {
    try {
        return body();
    } catch (const Error& e) {
        std::fprintf(stderr, "%s: %s\n", who.c_str(), e.what());
        return static_cast<int>(e.code());
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s: %s\n", who.c_str(), e.what());
        return static_cast<int>(ExitCode::failure);
    }
}

}  // namespace iprobe
