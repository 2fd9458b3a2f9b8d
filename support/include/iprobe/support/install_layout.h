// Where iprobe's parts are.  An install prefix and a build tree have the same
// shape: PREFIX/bin (tools), PREFIX/libexec/iprobe (the dispatcher's helper
// executables, the private CRIU), PREFIX/lib (the runtime, the handler, the
// LLVM pass), so one rule finds both from the running executable.
#pragma once

#include <filesystem>
#include <optional>
#include <string_view>

namespace iprobe {

class InstallLayout {
public:
    explicit InstallLayout(std::filesystem::path prefix) : prefix_(std::move(prefix)) {}

    // The layout the running executable belongs to: the nearest directory
    // above it holding libexec/iprobe or lib/libiprobe-rt.so (a tool in bin/,
    // a helper in libexec/iprobe/, a test in tests/); else the parent of its
    // directory, as for /usr/bin/x.
    static const InstallLayout& current();
    static InstallLayout of_executable(const std::filesystem::path& exe);

    const std::filesystem::path& prefix() const { return prefix_; }
    std::filesystem::path bin() const { return prefix_ / "bin"; }
    std::filesystem::path libexec() const { return prefix_ / "libexec" / "iprobe"; }
    std::filesystem::path lib() const { return prefix_ / "lib"; }

    // libexec/iprobe/NAME when it is there and executable.
    std::optional<std::filesystem::path> helper(std::string_view name) const;
    // lib/NAME, else lib/iprobe/NAME, when readable.
    std::optional<std::filesystem::path> library(std::string_view name) const;

private:
    std::filesystem::path prefix_;
};

}  // namespace iprobe
