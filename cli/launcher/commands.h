#pragma once

#include <string>
#include <vector>

namespace iprobe::launcher::cli {

// Each takes the arguments after the subcommand name and returns the exit code.
int clone_main(const std::vector<std::string>& args);
int debug_main(const std::vector<std::string>& args);
int agent_main(const std::vector<std::string>& args);
int investigate_main(const std::vector<std::string>& args);

// Parses "1234" as a PID; throws Error(usage).
int parse_pid(const std::string& text);

}  // namespace iprobe::launcher::cli
