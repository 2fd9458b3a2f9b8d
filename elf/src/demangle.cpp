#include "iprobe/elf/demangle.h"

#include <cxxabi.h>

#include <cstdlib>
#include <memory>
#include <optional>

extern "C" {
#include <libiberty/demangle.h>
}

namespace iprobe::elf {

namespace {

using Owned = std::unique_ptr<char, decltype(&std::free)>;

// Rust's v0 names (_R...) and its legacy ones (_ZN...17h<hash>E, which the
// C++ demangler reads as C++ with the hash kept as a name): rust_demangle
// says null for anything else, a C++ name included.
std::optional<std::string> rust(const std::string& name) {
    Owned out(rust_demangle(name.c_str(), DMGL_PARAMS | DMGL_ANSI), &std::free);
    if (!out) return std::nullopt;
    return std::string(out.get());
}

}  // namespace

std::string demangle(const std::string& name) {
    if (name.size() < 2 || name[0] != '_' || (name[1] != 'Z' && name[1] != 'R')) return name;
    if (auto r = rust(name)) return *r;
    if (name[1] != 'Z') return name;
    int status = 0;
    Owned out(abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status), &std::free);
    return status == 0 && out ? std::string(out.get()) : name;
}

}  // namespace iprobe::elf
