// Reads the IPROBE_PL_SECTION section (struct iprobe_site_entry records, see
// probe_list.h) of a linked ELF module into a ProbeList.  The records hold
// self-relative offsets the static linker already resolved, so the section
// bytes plus its sh_addr give every address; the symbol table fills in what
// the compiler could not record, DWARF gives file:line.
#include "iprobe/probelist/site_section.h"

#include <elf.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <span>

#include "iprobe/elf/demangle.h"
#include "iprobe/elf/elf_file.h"
#include "iprobe/elf/source_lines.h"
#include "iprobe/support/error.h"
#include "iprobe/support/fd.h"

namespace iprobe::probelist {

namespace {

constexpr std::uint8_t kNop5[5] = {0x0f, 0x1f, 0x44, 0x00, 0x00};

Error corrupt(const std::string& path, const std::string& why) {
    return Error(path + ": corrupt " IPROBE_PL_SECTION " section (" + why +
                     "); rebuild it with iprobe-cc --mode=llvm",
                 ExitCode::bad_input);
}

// The bytes at a link-time address, from the executable section that holds them.
bool code_bytes_at(const elf::ElfFile& file, std::uint64_t address, std::uint8_t* out, std::size_t size) {
    const elf::ElfSection* section = file.section_containing(address);
    if (!section || section->type != SHT_PROGBITS || !section->executable() ||
        size > section->size - (address - section->address))
        return false;
    const auto bytes = file.section_bytes(*section);
    if (bytes.size() != section->size) return false;
    std::memcpy(out, bytes.data() + (address - section->address), size);
    return true;
}

struct RawEntry {
    ProbeKind kind;
    std::uint64_t site;
    std::uint64_t function;  // 0 when not recorded
    std::uint8_t size;
    bool function_entry;     // IPROBE_SITE_FLAG_FUNCTION_ENTRY: the site is the function's patchable entry
    std::string name;
};

// A 5-byte NOP as compilers put at a patchable function entry: nopl
// disp8(%rax,%rax,1) (clang writes displacement 8, coldpatch 0).
bool is_entry_nop(const std::uint8_t* b) { return b[0] == 0x0f && b[1] == 0x1f && b[2] == 0x44 && b[3] == 0x00; }

// The NOP __patchable_function_entries lists at the start of `function`
// (after an endbr64), or 0.
std::uint64_t patchable_entry_of(const std::vector<std::uint64_t>& pads, std::uint64_t function) {
    auto it = std::lower_bound(pads.begin(), pads.end(), function);
    return it != pads.end() && *it - function <= 4 ? *it : 0;
}

std::vector<RawEntry> parse_entries(const std::string& path, std::uint64_t section_address,
                                    std::span<const std::uint8_t> data) {
    std::vector<RawEntry> entries;
    const std::uint8_t* bytes = data.data();
    const std::size_t total = data.size();
    std::size_t offset = 0;
    while (offset + IPROBE_SITE_ENTRY_ALIGN <= total) {
        iprobe_site_entry entry;
        if (total - offset < sizeof entry) {
            // Only linker padding may trail the last entry.
            if (std::any_of(bytes + offset, bytes + total, [](std::uint8_t b) { return b != 0; }))
                throw corrupt(path, "truncated entry at offset " + std::to_string(offset));
            break;
        }
        std::memcpy(&entry, bytes + offset, sizeof entry);
        if (entry.size == 0) {
            offset += IPROBE_SITE_ENTRY_ALIGN;
            continue;
        }
        if (entry.size < sizeof entry + 1 || entry.size % IPROBE_SITE_ENTRY_ALIGN != 0 ||
            entry.size > total - offset)
            throw corrupt(path, "bad entry size at offset " + std::to_string(offset));
        if (entry.version != IPROBE_SITE_ENTRY_VERSION)
            throw Error(path + ": " IPROBE_PL_SECTION " entry version " + std::to_string(entry.version) +
                            " is not supported (this iprobe reads version " +
                            std::to_string(IPROBE_SITE_ENTRY_VERSION) + ")",
                        ExitCode::bad_input);
        if (entry.kind < IPROBE_KIND_ENTRY || entry.kind > IPROBE_KIND_POINT)
            throw corrupt(path, "unknown probe kind " + std::to_string(entry.kind));
        if (entry.site_size != sizeof kNop5)
            throw corrupt(path, "unsupported placeholder size " + std::to_string(entry.site_size));
        const char* name = reinterpret_cast<const char*>(bytes + offset + sizeof entry);
        const std::size_t name_room = entry.size - sizeof entry;
        const std::size_t name_length = strnlen(name, name_room);
        if (name_length == name_room) throw corrupt(path, "unterminated name");

        const std::uint64_t entry_address = section_address + offset;
        RawEntry raw;
        raw.kind = static_cast<ProbeKind>(entry.kind);
        raw.site = entry_address + offsetof(iprobe_site_entry, site) + static_cast<std::int64_t>(entry.site);
        raw.function = entry.function == 0 ? 0
                                           : entry_address + offsetof(iprobe_site_entry, function) +
                                                 static_cast<std::int64_t>(entry.function);
        raw.size = entry.site_size;
        raw.function_entry = (entry.flags & IPROBE_SITE_FLAG_FUNCTION_ENTRY) != 0;
        raw.name.assign(name, name_length);
        entries.push_back(std::move(raw));
        offset += entry.size;
    }
    return entries;
}

}  // namespace

std::optional<ProbeList> read_site_section(const std::string& elf_path) {
    {
        UniqueFd fd(::open(elf_path.c_str(), O_RDONLY | O_CLOEXEC));
        if (!fd) throw_errno(elf_path, ExitCode::not_found);
        char magic[SELFMAG] = {};
        if (::pread(fd.get(), magic, sizeof magic, 0) != SELFMAG || std::memcmp(magic, ELFMAG, SELFMAG) != 0)
            return std::nullopt;
    }
    const elf::ElfFile file(elf_path);
    const elf::ElfSection* section = file.section(IPROBE_PL_SECTION);
    if (!section) return std::nullopt;
    if (!file.is_executable_or_library())
        throw Error(elf_path + ": an object file's " IPROBE_PL_SECTION
                               " section is not resolved yet; link it and list the executable or library",
                    ExitCode::bad_input);
    if (section->type != SHT_PROGBITS) throw corrupt(elf_path, "not PROGBITS");
    const auto bytes = file.section_bytes(*section);
    if (bytes.size() != section->size) throw corrupt(elf_path, "unreadable");

    std::vector<RawEntry> entries = parse_entries(elf_path, section->address, bytes);
    const elf::SourceLines lines(file);
    const std::vector<std::uint64_t> pads = file.patchable_entries();
    // A function's patchable entry: the site is the NOP the compiler listed.
    for (RawEntry& raw : entries) {
        if (!raw.function_entry) continue;
        if (raw.kind != ProbeKind::entry) throw corrupt(elf_path, "a function-entry record of '" + raw.name + "' is not an entry");
        if (!raw.function)
            if (const elf::ElfSymbol* symbol = file.symbol_named(raw.name)) raw.function = symbol->address;
        raw.site = raw.function ? patchable_entry_of(pads, raw.function) : 0;
        if (!raw.site)
            throw corrupt(elf_path, "'" + raw.name + "' has no patchable entry in __patchable_function_entries");
    }

    ProbeList list;
    list.flow = IPROBE_FLOW_LLVM;
    if (file.is_position_independent()) {
        list.flags |= IPROBE_PL_FLAG_PIE;
        if (file.is_shared_library()) list.flags |= IPROBE_PL_FLAG_SHARED;
    }
    std::error_code ignored;
    const auto absolute = std::filesystem::weakly_canonical(elf_path, ignored);
    const std::string soname = file.soname();
    list.module = !soname.empty() ? soname : (ignored ? elf_path : absolute.string());
    list.build_id = file.build_id();

    // Where the compiler could not record the function (preemptible symbols)
    // and the symbol table is stripped, the function's own entry probe is the
    // best start address there is.
    std::map<std::string, std::uint64_t> entry_sites;
    for (const RawEntry& raw : entries)
        if (raw.kind == ProbeKind::entry) entry_sites.emplace(raw.name, raw.site);

    bool any_source = false;
    list.probes.reserve(entries.size());
    for (const RawEntry& raw : entries) {
        Probe probe;
        probe.kind = raw.kind;
        probe.form = SiteForm::nop;
        probe.size = raw.size;
        probe.site = raw.site;
        std::uint8_t present[sizeof kNop5];
        if (!code_bytes_at(file, raw.site, present, sizeof present))
            throw corrupt(elf_path, "probe site of '" + raw.name + "' is outside the code");
        if (raw.function_entry ? !is_entry_nop(present) : std::memcmp(present, kNop5, sizeof kNop5) != 0)
            throw Error(elf_path + ": probe site of '" + raw.name + "' does not hold the placeholder NOP; "
                                   "the binary was modified after linking",
                        ExitCode::bad_input);
        std::copy(std::begin(present), std::end(present), probe.placeholder.begin());
        probe.original = probe.placeholder;

        probe.function_address = raw.function;
        if (!probe.function_address)
            if (const elf::ElfSymbol* symbol = file.function_at(raw.site)) probe.function_address = symbol->address;
        if (!probe.function_address && raw.kind != ProbeKind::point)
            if (auto it = entry_sites.find(raw.name); it != entry_sites.end()) probe.function_address = it->second;

        probe.function = raw.name;
        probe.demangled = raw.kind == ProbeKind::point ? raw.name : elf::demangle(raw.name);
        if (const auto where = lines.at(raw.site)) {
            probe.file = where->file;
            probe.line = where->line;
            any_source = true;
        }
        if (raw.function_entry) {
            Probe exit = probe;
            exit.kind = ProbeKind::exit;
            exit.form = SiteForm::ret;
            list.probes.push_back(std::move(probe));
            list.probes.push_back(std::move(exit));
            continue;
        }
        list.probes.push_back(std::move(probe));
    }
    if (any_source) list.flags |= IPROBE_PL_FLAG_DWARF;
    // Two records for one entry: functions the linker folded into one (ICF).
    std::stable_sort(list.probes.begin(), list.probes.end(), [](const Probe& a, const Probe& b) { return a.site < b.site; });
    for (std::size_t i = 0; i + 3 < list.probes.size() + 1 && i + 2 < list.probes.size();) {
        if (serves_returns(list.probes, i) && list.probes[i + 2].site == list.probes[i].site)
            list.probes.erase(list.probes.begin() + static_cast<long>(i) + 2, list.probes.begin() + static_cast<long>(i) + 4);
        else
            i++;
    }
    list.normalize();
    return list;
}

}  // namespace iprobe::probelist
