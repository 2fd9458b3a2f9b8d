// C++ symbol names as people read them.
#pragma once

#include <string>

namespace iprobe::elf {

// Demangled C++ name, or `name` unchanged when it is not a mangled name.
std::string demangle(const std::string& name);

}  // namespace iprobe::elf
