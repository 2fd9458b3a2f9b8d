#include "iprobe/site_section.hpp"

namespace iprobe {

// Owned by the LLVM-pass area; until it lands, binaries carry no section.
std::optional<ProbeList> read_site_section(const std::string&) { return std::nullopt; }

}  // namespace iprobe
