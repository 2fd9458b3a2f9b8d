// Errors that reach the user: a message that says what to do, and the exit
// code the CLI returns for it.
#pragma once

#include <functional>
#include <stdexcept>
#include <string>

namespace iprobe {

// Exit codes shared by every iprobe tool (documented in README.md).
enum class ExitCode : int {
    ok = 0,
    failure = 1,       // the operation failed; nothing was changed
    usage = 2,         // bad command line
    bad_input = 3,     // input file or target is not what the command needs
    permission = 4,    // not allowed (ptrace, root)
    not_found = 5,     // no such file / process / probe
    busy = 6,          // another iprobe session holds the target
    unavailable = 7,   // a needed facility (counter, kernel feature, CRIU) is absent
    interrupted = 130, // SIGINT/SIGTERM: what was half done is undone (128 + SIGINT, as shells report it)
};

class Error : public std::runtime_error {
public:
    explicit Error(std::string message, ExitCode code = ExitCode::failure)
        : std::runtime_error(std::move(message)), code_(code) {}
    ExitCode code() const noexcept { return code_; }

private:
    ExitCode code_;
};

// strerror(errno) appended to `what`, as an Error.
[[noreturn]] void throw_errno(const std::string& what, ExitCode code = ExitCode::failure);

// Runs a tool's body and turns what it throws into the exit-code contract:
// "<who>: <message>" on stderr, then the Error's code (1 for any other
// exception).  Every CLI's main() goes through here.
int run_reporting_errors(const std::string& who, const std::function<int()>& body);

}  // namespace iprobe
