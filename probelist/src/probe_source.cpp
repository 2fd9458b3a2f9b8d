#include "iprobe/probelist/probe_source.h"

#include <sys/stat.h>

#include <cstring>
#include <fstream>

#include "iprobe/probelist/site_section.h"
#include "iprobe/probelist/symbol_probes.h"
#include "iprobe/support/error.h"
#include "iprobe/support/file.h"

namespace iprobe::probelist {

namespace {

bool exists(const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0;
}

bool starts_with_magic(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    char magic[IPROBE_PL_MAGIC_SIZE] = {};
    return in.read(magic, sizeof magic) && std::memcmp(magic, IPROBE_PL_MAGIC, IPROBE_PL_MAGIC_SIZE) == 0;
}

}  // namespace

ProbeList load_probes(const std::string& path) {
    if (!exists(path)) throw Error(path + ": no such file", ExitCode::not_found);
    if (starts_with_magic(path)) return ProbeList::load(path);
    const std::string side = path + IPROBE_PL_SUFFIX;
    if (exists(side)) return ProbeList::load(side);
    if (auto from_section = read_site_section(path)) return *std::move(from_section);
    // Nobody prepared it: entries relocated into trampolines, from its symbols.
    return probes_from_symbols(path);
}

}  // namespace iprobe::probelist
