#include "iprobe/support/install_layout.h"

#include <unistd.h>

namespace iprobe {

namespace fs = std::filesystem;

InstallLayout InstallLayout::of_executable(const fs::path& exe) {
    std::error_code ec;
    for (fs::path dir = exe.parent_path(); !dir.empty(); dir = dir.parent_path()) {
        if (fs::is_directory(dir / "libexec" / "iprobe", ec) || fs::exists(dir / "lib" / "libiprobe-rt.so", ec))
            return InstallLayout(dir);
        if (dir == dir.root_path()) break;
    }
    return InstallLayout(exe.parent_path().parent_path());
}

const InstallLayout& InstallLayout::current() {
    static const InstallLayout layout = [] {
        std::error_code ec;
        const fs::path self = fs::read_symlink("/proc/self/exe", ec);
        return ec ? InstallLayout(fs::path("/usr/local")) : of_executable(self);
    }();
    return layout;
}

std::optional<fs::path> InstallLayout::helper(std::string_view name) const {
    fs::path path = libexec() / name;
    if (::access(path.c_str(), X_OK) == 0) return path;
    return std::nullopt;
}

std::optional<fs::path> InstallLayout::library(std::string_view name) const {
    for (fs::path path : {lib() / name, lib() / "iprobe" / name})
        if (::access(path.c_str(), R_OK) == 0) return path;
    return std::nullopt;
}

}  // namespace iprobe
