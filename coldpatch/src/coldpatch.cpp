#include "iprobe/coldpatch/coldpatch.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <cstdio>
#include <cstring>
#include <set>

#include "iprobe/probelist/site_section.h"
#include "iprobe/probelist/symbol_probes.h"
#include "iprobe/support/error.h"
#include "iprobe/support/file.h"

namespace iprobe::coldpatch {

namespace {

bool exists(const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0;
}

std::string base_name(const std::string& path) {
    const auto slash = path.rfind('/');
    return slash == std::string::npos ? path : path.substr(slash + 1);
}

bool site_holds(const elf::ElfFile& elf, const probelist::Probe& p, const std::uint8_t* expected) {
    const auto offset = elf.file_offset(p.site);
    if (!offset || *offset + p.size > elf.bytes().size()) return false;
    return std::memcmp(elf.bytes().data() + *offset, expected, p.size) == 0;
}

// A previous coldpatch of this very build: its list is beside the binary,
// names the same build-id and every site already holds its placeholder.
bool already_coldpatched(const elf::ElfFile& elf, const std::string& probes_path) {
    if (!exists(probes_path)) return false;
    probelist::ProbeList previous;
    try {
        previous = probelist::ProbeList::load(probes_path);
    } catch (const Error&) {
        return false;
    }
    if ((previous.flow != IPROBE_FLOW_FINSTRUMENT && previous.flow != IPROBE_FLOW_PATCHABLE_ENTRY) ||
        previous.build_id != elf.build_id())
        return false;
    return std::all_of(previous.probes.begin(), previous.probes.end(),
                       [&](const probelist::Probe& p) { return site_holds(elf, p, p.placeholder.data()); });
}

// Developer-marked sites (IPROBE_POINT) the binary describes itself.
void merge_marked_sites(const probelist::ProbeList& marked, probelist::ProbeList& list) {
    std::set<std::uint64_t> sites;
    for (const auto& p : list.probes) sites.insert(p.site);
    for (const auto& p : marked.probes)
        if (p.kind == probelist::ProbeKind::point && sites.insert(p.site).second) list.probes.push_back(p);
    list.normalize();
}

// Built by the LLVM flow: entry/exit placeholders are described in the binary.
bool has_embedded_functions(const std::optional<probelist::ProbeList>& marked) {
    return marked && std::any_of(marked->probes.begin(), marked->probes.end(),
                                 [](const probelist::Probe& p) { return p.kind != probelist::ProbeKind::point; });
}

// The entry flow's functions the gcc plugin left without a pad (small
// ones, marked) become relocated entries beside the padded ones; those
// that cannot be relocated either are kept in `result`, with the reason.
void add_unpadded_functions(const elf::ElfFile& elf, const std::set<std::uint64_t>& marked,
                            std::vector<probelist::Probe>& probes, ColdpatchResult& result) {
    if (marked.empty()) return;
    probelist::RelocatedEntries unpadded = probelist::relocated_entries(elf, &marked);
    for (auto& p : unpadded.probes) {
        result.relocated += p.relocated;
        p.moved.clear();  // read from the binary when enabled: the list keeps the first bytes only
        probes.push_back(std::move(p));
    }
    result.refused = std::move(unpadded.refused);
}

void count_kinds(ColdpatchResult& r) {
    for (const auto& p : r.list.probes) {
        if (p.kind == probelist::ProbeKind::entry) ++r.entries;
        if (p.kind == probelist::ProbeKind::exit) ++r.exits;
        if (p.kind == probelist::ProbeKind::point) ++r.points;
    }
}

std::vector<std::uint8_t> patched_image(const elf::ElfFile& elf, const probelist::ProbeList& list) {
    std::vector<std::uint8_t> image(elf.bytes().begin(), elf.bytes().end());
    for (const auto& p : list.probes) {
        const auto offset = elf.file_offset(p.site);
        // Marked sites the compiler already emitted as their placeholder, pads
        // of an earlier coldpatch.
        if (offset && *offset + p.size <= image.size() &&
            std::memcmp(image.data() + *offset, p.placeholder.data(), p.size) == 0)
            continue;
        if (!offset || *offset + p.size > image.size() ||
            std::memcmp(image.data() + *offset, p.original.data(), p.size) != 0)
            throw Error(elf.path() + ": site " + std::to_string(p.site) +
                            " does not hold the call that was decoded there (corrupt ELF?)",
                        ExitCode::bad_input);
        std::memcpy(image.data() + *offset, p.placeholder.data(), p.size);
    }
    return image;
}

// Writes the list, then the binary; if the binary cannot be written the
// previous list (or its absence) is restored, so a failed run changes nothing.
void write_both(const std::string& input, const std::string& output, const std::vector<std::uint8_t>& image,
                const std::string& probes_path, const probelist::ProbeList& list) {
    const bool had_list = exists(probes_path);
    const std::vector<std::uint8_t> old_list = had_list ? read_file(probes_path) : std::vector<std::uint8_t>{};
    const auto list_bytes = list.serialize();
    write_file_atomic(probes_path, list_bytes.data(), list_bytes.size(), had_list ? probes_path : std::string{});
    try {
        write_file_atomic(output, image.data(), image.size(), input);
    } catch (...) {
        if (had_list)
            write_file_atomic(probes_path, old_list.data(), old_list.size(), probes_path);
        else
            std::remove(probes_path.c_str());
        throw;
    }
}

}  // namespace

ColdpatchResult coldpatch(const std::string& path, const ColdpatchOptions& options) {
    const auto started = std::chrono::steady_clock::now();
    ColdpatchResult result;
    result.binary_path = options.output.empty() ? path : options.output;
    result.probes_path = options.probes_path.empty() ? result.binary_path + IPROBE_PL_SUFFIX : options.probes_path;

    const elf::ElfFile elf(path);
    elf.require_x86_64_executable_or_library();
    std::string module = elf.is_shared_library() ? elf.soname() : std::string{};
    if (module.empty()) module = base_name(result.binary_path);

    PlaceholderScan scan = scan_placeholders(elf, module);
    result.hook_tail_jumps = scan.hook_tail_jumps;
    result.kinds_inferred = scan.kinds_inferred;
    bool found_calls = !scan.list.probes.empty();
    {
        auto entries = scan_patchable_entries(elf);
        result.foreign_pads = entries.foreign_pads;
        result.unnamed_pads = entries.unnamed_pads;
        const bool any_pad_left = std::any_of(entries.probes.begin(), entries.probes.end(), [&](const probelist::Probe& p) {
            return p.original != p.placeholder && site_holds(elf, p, p.original.data());
        });
        const std::set<std::uint64_t> unpadded = probelist::marked_unpadded(elf);
        if (!found_calls && (!entries.probes.empty() || !unpadded.empty())) scan.list.flow = IPROBE_FLOW_PATCHABLE_ENTRY;
        add_unpadded_functions(elf, unpadded, entries.probes, result);
        found_calls = found_calls || any_pad_left;
        for (auto& p : entries.probes) scan.list.probes.push_back(std::move(p));
        scan.list.normalize();
    }
    const auto marked = probelist::read_site_section(path);
    if (marked) merge_marked_sites(*marked, scan.list);
    result.list = std::move(scan.list);
    auto finish = [&] {
        count_kinds(result);
        result.elapsed_ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
        return result;
    };

    if (!found_calls && has_embedded_functions(marked)) {
        result.list = *marked;
        result.outcome = ColdpatchOutcome::embedded;
        return finish();
    }
    if (!found_calls && result.binary_path == path && already_coldpatched(elf, result.probes_path)) {
        result.list = probelist::ProbeList::load(result.probes_path);
        result.outcome = ColdpatchOutcome::already_patched;
        return finish();
    }
    if (result.list.probes.empty()) {
        if (!options.allow_no_placeholders)
            throw Error(path + ": no placeholders: no calls to " + kEnterHook + "/" + kExitHook +
                            " and no function starting with a patchable-entry pad found; compile with iprobe-cc (-fpatchable-function-entry=5,0 or "
                            "-finstrument-functions)",
                        ExitCode::bad_input);
        result.outcome = ColdpatchOutcome::no_placeholders;
        return finish();
    }
    const auto image = patched_image(elf, result.list);
    write_both(path, result.binary_path, image, result.probes_path, result.list);
    result.outcome = ColdpatchOutcome::patched;
    return finish();
}

std::string summary_line(const ColdpatchResult& r) {
    const std::string name = base_name(r.binary_path);
    char ms[32];
    std::snprintf(ms, sizeof ms, "%.0f", r.elapsed_ms);
    switch (r.outcome) {
        case ColdpatchOutcome::already_patched:
            return name + ": already coldpatched (" + std::to_string(r.list.probes.size()) +
                   " probes in " + r.probes_path + "); nothing to do";
        case ColdpatchOutcome::no_placeholders:
            return name + ": no placeholders; left unchanged";
        case ColdpatchOutcome::embedded:
            return name + ": built with the LLVM flow, its " + std::to_string(r.list.probes.size()) +
                   " probes are embedded (see 'iprobe list'); nothing to coldpatch";
        case ColdpatchOutcome::patched: break;
    }
    std::string line = "coldpatched " + name + ": " + std::to_string(r.list.probes.size()) + " probes (" +
                       std::to_string(r.entries) + " entry" +
                       (r.relocated ? " (" + std::to_string(r.relocated) + " relocated, without a pad)" : std::string()) +
                       ", " + std::to_string(r.exits) + " exit";
    if (r.points) line += ", " + std::to_string(r.points) + " point";
    line += ") in " + std::string(ms) + " ms -> " + r.probes_path;
    return line;
}

}  // namespace iprobe::coldpatch
