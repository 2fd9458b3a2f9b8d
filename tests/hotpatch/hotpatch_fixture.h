// A running hp_target (or any program) driven through a FIFO, and helpers
// to run `iprobe` subcommands against it.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "testutil.h"

namespace iprobe::test {

std::string targets_dir();
std::string iprobe_bin();

CommandResult iprobe(const std::vector<std::string>& args,
                     std::chrono::milliseconds timeout = std::chrono::seconds(60));

class HpTarget {
public:
    explicit HpTarget(int threads, const std::string& binary = targets_dir() + "/hp_target");
    ~HpTarget();  // kills the target (its iprobe region dies with it)
    pid_t pid() const { return child_.pid(); }
    Child& child() { return child_; }
    // Sends a command line and waits for its "ok <word> <value>" answer.
    long command(const std::string& line, std::chrono::milliseconds timeout = std::chrono::seconds(60));
    std::string output() const;

private:
    TempDir dir_;
    std::string fifo_, out_;
    std::size_t answers_ = 0;
    Child child_;
};

// Bytes of every executable file mapping of `path` in `pid` (the code).
std::vector<std::uint8_t> text_of(pid_t pid, const std::string& path_suffix);
// What those mappings hold when nothing changed them: the mapped file's
// bytes at their offsets (empty chunks where the file cannot be read).
std::vector<std::uint8_t> file_text_of(pid_t pid, const std::string& path_suffix);

// Addresses of the code bytes of `path` in `pid` that differ from `before`
// (a text_of() taken earlier, the mappings unchanged).
std::vector<std::uint64_t> changed_code(pid_t pid, const std::string& path_suffix, const std::vector<std::uint8_t>& before);
// `size` bytes of `pid`'s memory at `address` (empty when unreadable).
std::vector<std::uint8_t> memory_of(pid_t pid, std::uint64_t address, std::size_t size);

// "calls" of `function` in a `report --json` output, -1 when absent.
long long json_calls(const std::string& json, const std::string& function);
// Its "completed", -1 when absent.
long long json_completed(const std::string& json, const std::string& function);
long long json_number(const std::string& json, const std::string& key);

// The lines of `out` holding every fragment, in order.
std::vector<std::string> lines_with(const std::string& out, const std::vector<std::string>& fragments);

}  // namespace iprobe::test
