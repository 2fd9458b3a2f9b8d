#include "iprobe/probelist/probe_source.h"

#include <sys/stat.h>

#include <unistd.h>

#include <cstring>
#include <optional>

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

// Checked before anything is read: a FIFO, device or directory is refused
// (bad_input) without blocking.
bool starts_with_magic(const std::string& path) {
    const UniqueFd fd = open_regular_file(path);
    char magic[IPROBE_PL_MAGIC_SIZE] = {};
    return ::pread(fd.get(), magic, sizeof magic, 0) == static_cast<ssize_t>(sizeof magic) &&
           std::memcmp(magic, IPROBE_PL_MAGIC, IPROBE_PL_MAGIC_SIZE) == 0;
}

// The list a build prepared for `path`, if any.
std::optional<ProbeList> prepared_probes(const std::string& path) {
    if (!exists(path)) throw Error(path + ": no such file", ExitCode::not_found);
    if (starts_with_magic(path)) return ProbeList::load(path);
    const std::string side = path + IPROBE_PL_SUFFIX;
    if (exists(side)) {
        ProbeList list = ProbeList::load(side);
        add_relocation_plans(list, path);  // the binary is at hand: its unpadded entries' bytes
        return list;
    }
    return read_site_section(path);
}

}  // namespace

ProbeList load_probes_or_symbols(const std::string& path) {
    if (auto prepared = prepared_probes(path)) return *std::move(prepared);
    return probes_from_symbols(path);
}

ProbeList load_probes(const std::string& path) {
    if (auto prepared = prepared_probes(path)) return *std::move(prepared);
    const std::string side = path + IPROBE_PL_SUFFIX;
    throw Error(path + ": no probes: neither " + side +
                    " nor an embedded probe section; build it with iprobe-cc (or run 'iprobe coldpatch " +
                    path + "')",
                ExitCode::bad_input);
}

}  // namespace iprobe::probelist
