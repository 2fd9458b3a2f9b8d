// Reads the IPROBE_PL_SECTION section (struct iprobe_site_entry records, see
// probe_list.h) of a linked ELF module into a ProbeList.  The records hold
// self-relative offsets the static linker already resolved, so the section
// bytes plus its sh_addr give every address; the symbol table fills in what
// the compiler could not record, DWARF gives file:line.
#include "iprobe/probelist/site_section.h"

#include <cxxabi.h>
#include <elfutils/libdw.h>
#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>

#include "iprobe/support/error.h"
#include "iprobe/support/fd.h"

namespace iprobe {

namespace {

constexpr std::uint8_t kNop5[5] = {0x0f, 0x1f, 0x44, 0x00, 0x00};

struct ElfCloser {
    void operator()(Elf* elf) const { elf_end(elf); }
};
using ElfPtr = std::unique_ptr<Elf, ElfCloser>;

struct DwarfCloser {
    void operator()(Dwarf* dwarf) const { dwarf_end(dwarf); }
};
using DwarfPtr = std::unique_ptr<Dwarf, DwarfCloser>;

struct Symbol {
    std::uint64_t address = 0;
    std::uint64_t size = 0;
    std::string name;
};

Error corrupt(const std::string& path, const std::string& why) {
    return Error(path + ": corrupt " IPROBE_PL_SECTION " section (" + why +
                     "); rebuild it with iprobe-cc --mode=llvm",
                 ExitCode::bad_input);
}

std::string section_name(Elf* elf, std::size_t names_index, Elf_Scn* section) {
    GElf_Shdr header;
    if (!gelf_getshdr(section, &header)) return {};
    const char* name = elf_strptr(elf, names_index, header.sh_name);
    return name ? name : "";
}

Elf_Scn* find_section(Elf* elf, const char* wanted) {
    std::size_t names_index = 0;
    if (elf_getshdrstrndx(elf, &names_index) != 0) return nullptr;
    for (Elf_Scn* section = elf_nextscn(elf, nullptr); section; section = elf_nextscn(elf, section))
        if (section_name(elf, names_index, section) == wanted) return section;
    return nullptr;
}

// FUNC symbols of .symtab and .dynsym, sorted by address (sized ones first
// at equal addresses so a lookup finds a real extent).
std::vector<Symbol> function_symbols(Elf* elf) {
    std::vector<Symbol> symbols;
    for (Elf_Scn* section = elf_nextscn(elf, nullptr); section; section = elf_nextscn(elf, section)) {
        GElf_Shdr header;
        if (!gelf_getshdr(section, &header)) continue;
        if (header.sh_type != SHT_SYMTAB && header.sh_type != SHT_DYNSYM) continue;
        Elf_Data* data = elf_getdata(section, nullptr);
        if (!data || header.sh_entsize == 0) continue;
        const std::size_t count = header.sh_size / header.sh_entsize;
        for (std::size_t i = 0; i < count; ++i) {
            GElf_Sym symbol;
            if (!gelf_getsym(data, static_cast<int>(i), &symbol)) continue;
            if (GELF_ST_TYPE(symbol.st_info) != STT_FUNC || symbol.st_shndx == SHN_UNDEF) continue;
            const char* name = elf_strptr(elf, header.sh_link, symbol.st_name);
            if (!name || !*name) continue;
            symbols.push_back({symbol.st_value, symbol.st_size, name});
        }
    }
    std::sort(symbols.begin(), symbols.end(), [](const Symbol& a, const Symbol& b) {
        return a.address != b.address ? a.address < b.address : a.size > b.size;
    });
    return symbols;
}

const Symbol* symbol_containing(const std::vector<Symbol>& symbols, std::uint64_t address) {
    auto it = std::upper_bound(symbols.begin(), symbols.end(), address,
                               [](std::uint64_t a, const Symbol& s) { return a < s.address; });
    while (it != symbols.begin()) {
        --it;
        if (address < it->address + std::max<std::uint64_t>(it->size, 1)) return &*it;
        if (it->size != 0) break;
    }
    return nullptr;
}

std::string demangle(const std::string& raw) {
    int status = 0;
    char* text = abi::__cxa_demangle(raw.c_str(), nullptr, nullptr, &status);
    if (status != 0 || !text) return raw;
    std::string out(text);
    std::free(text);
    return out;
}

std::vector<std::uint8_t> build_id(Elf* elf) {
    for (Elf_Scn* section = elf_nextscn(elf, nullptr); section; section = elf_nextscn(elf, section)) {
        GElf_Shdr header;
        if (!gelf_getshdr(section, &header) || header.sh_type != SHT_NOTE) continue;
        Elf_Data* data = elf_getdata(section, nullptr);
        if (!data) continue;
        GElf_Nhdr note;
        std::size_t offset = 0, name_offset = 0, desc_offset = 0;
        while ((offset = gelf_getnote(data, offset, &note, &name_offset, &desc_offset)) > 0) {
            const auto* bytes = static_cast<const std::uint8_t*>(data->d_buf);
            if (note.n_type == NT_GNU_BUILD_ID && note.n_namesz == 4 &&
                std::memcmp(bytes + name_offset, "GNU", 4) == 0)
                return {bytes + desc_offset, bytes + desc_offset + note.n_descsz};
        }
    }
    return {};
}

struct ModuleShape {
    bool has_interp = false;
    std::string soname;
};

ModuleShape module_shape(Elf* elf) {
    ModuleShape shape;
    std::size_t count = 0;
    if (elf_getphdrnum(elf, &count) == 0)
        for (std::size_t i = 0; i < count; ++i) {
            GElf_Phdr header;
            if (gelf_getphdr(elf, static_cast<int>(i), &header) && header.p_type == PT_INTERP)
                shape.has_interp = true;
        }
    for (Elf_Scn* section = elf_nextscn(elf, nullptr); section; section = elf_nextscn(elf, section)) {
        GElf_Shdr header;
        if (!gelf_getshdr(section, &header) || header.sh_type != SHT_DYNAMIC) continue;
        Elf_Data* data = elf_getdata(section, nullptr);
        if (!data || header.sh_entsize == 0) continue;
        for (std::size_t i = 0; i < header.sh_size / header.sh_entsize; ++i) {
            GElf_Dyn entry;
            if (!gelf_getdyn(data, static_cast<int>(i), &entry) || entry.d_tag != DT_SONAME) continue;
            if (const char* name = elf_strptr(elf, header.sh_link, entry.d_un.d_val)) shape.soname = name;
        }
    }
    return shape;
}

// The bytes at a link-time address, from the section that holds them.
bool bytes_at(Elf* elf, std::uint64_t address, std::uint8_t* out, std::size_t size) {
    for (Elf_Scn* section = elf_nextscn(elf, nullptr); section; section = elf_nextscn(elf, section)) {
        GElf_Shdr header;
        if (!gelf_getshdr(section, &header) || header.sh_type != SHT_PROGBITS) continue;
        if (!(header.sh_flags & SHF_EXECINSTR)) continue;
        if (address < header.sh_addr || address + size > header.sh_addr + header.sh_size) continue;
        Elf_Data* data = elf_getdata(section, nullptr);
        if (!data || !data->d_buf) return false;
        std::memcpy(out, static_cast<const std::uint8_t*>(data->d_buf) + (address - header.sh_addr), size);
        return true;
    }
    return false;
}

// file:line of code addresses.  clang emits no .debug_aranges by default, so
// the compilation units' address ranges are indexed once up front.
class SourceLines {
public:
    explicit SourceLines(Elf* elf) : dwarf_(dwarf_begin_elf(elf, DWARF_C_READ, nullptr)) {
        if (dwarf_) index_units();
    }

    bool lookup(std::uint64_t address, std::string& file, std::uint32_t& line) {
        Dwarf_Die unit;
        if (!unit_at(address, unit)) return false;
        Dwarf_Line* row = dwarf_getsrc_die(&unit, address);
        if (!row) return false;
        int number = 0;
        if (dwarf_lineno(row, &number) != 0) return false;
        const char* source = dwarf_linesrc(row, nullptr, nullptr);
        if (!source) return false;
        file = source;
        line = static_cast<std::uint32_t>(number);
        return true;
    }

private:
    struct UnitRange {
        std::uint64_t low, high;
        Dwarf_Off die;
    };

    void index_units() {
        Dwarf_Off offset = 0, next = 0;
        std::size_t header_size = 0;
        while (dwarf_nextcu(dwarf_.get(), offset, &next, &header_size, nullptr, nullptr, nullptr) == 0) {
            Dwarf_Die unit;
            if (dwarf_offdie(dwarf_.get(), offset + header_size, &unit)) {
                Dwarf_Addr base = 0, low = 0, high = 0;
                std::ptrdiff_t cursor = 0;
                while ((cursor = dwarf_ranges(&unit, cursor, &base, &low, &high)) > 0)
                    if (high > low) ranges_.push_back({low, high, offset + header_size});
            }
            offset = next;
        }
        std::sort(ranges_.begin(), ranges_.end(),
                  [](const UnitRange& a, const UnitRange& b) { return a.low < b.low; });
    }

    bool unit_at(std::uint64_t address, Dwarf_Die& unit) {
        if (!dwarf_) return false;
        auto it = std::upper_bound(ranges_.begin(), ranges_.end(), address,
                                   [](std::uint64_t a, const UnitRange& r) { return a < r.low; });
        // Units rarely overlap; look back a little for one that does.
        for (int step = 0; step < 64 && it != ranges_.begin(); ++step) {
            --it;
            if (address < it->high) return dwarf_offdie(dwarf_.get(), it->die, &unit) != nullptr;
        }
        return dwarf_addrdie(dwarf_.get(), address, &unit) != nullptr;
    }

    DwarfPtr dwarf_;
    std::vector<UnitRange> ranges_;
};

struct RawEntry {
    ProbeKind kind;
    std::uint64_t site;
    std::uint64_t function;  // 0 when not recorded
    std::uint8_t size;
    std::string name;
};

std::vector<RawEntry> parse_entries(const std::string& path, const GElf_Shdr& header, const Elf_Data& data) {
    std::vector<RawEntry> entries;
    const auto* bytes = static_cast<const std::uint8_t*>(data.d_buf);
    const std::size_t total = data.d_size;
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

        const std::uint64_t entry_address = header.sh_addr + offset;
        RawEntry raw;
        raw.kind = static_cast<ProbeKind>(entry.kind);
        raw.site = entry_address + offsetof(iprobe_site_entry, site) + static_cast<std::int64_t>(entry.site);
        raw.function = entry.function == 0 ? 0
                                           : entry_address + offsetof(iprobe_site_entry, function) +
                                                 static_cast<std::int64_t>(entry.function);
        raw.size = entry.site_size;
        raw.name.assign(name, name_length);
        entries.push_back(std::move(raw));
        offset += entry.size;
    }
    return entries;
}

}  // namespace

std::optional<ProbeList> read_site_section(const std::string& elf_path) {
    if (elf_version(EV_CURRENT) == EV_NONE) throw Error("libelf: version mismatch");
    UniqueFd fd(::open(elf_path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd) throw_errno(elf_path, ExitCode::not_found);
    ElfPtr elf(elf_begin(fd.get(), ELF_C_READ_MMAP, nullptr));
    if (!elf || elf_kind(elf.get()) != ELF_K_ELF) return std::nullopt;

    Elf_Scn* section = find_section(elf.get(), IPROBE_PL_SECTION);
    if (!section) return std::nullopt;
    GElf_Ehdr file_header;
    if (!gelf_getehdr(elf.get(), &file_header)) throw corrupt(elf_path, "no ELF header");
    if (file_header.e_type != ET_EXEC && file_header.e_type != ET_DYN)
        throw Error(elf_path + ": an object file's " IPROBE_PL_SECTION
                               " section is not resolved yet; link it and list the executable or library",
                    ExitCode::bad_input);
    GElf_Shdr header;
    Elf_Data* data = nullptr;
    if (!gelf_getshdr(section, &header) || !(data = elf_getdata(section, nullptr)))
        throw corrupt(elf_path, "unreadable");
    if (header.sh_type != SHT_PROGBITS || !data->d_buf) throw corrupt(elf_path, "not PROGBITS");

    const std::vector<RawEntry> entries = parse_entries(elf_path, header, *data);
    const std::vector<Symbol> symbols = function_symbols(elf.get());
    SourceLines lines(elf.get());

    ProbeList list;
    list.flow = IPROBE_FLOW_LLVM;
    const ModuleShape shape = module_shape(elf.get());
    if (file_header.e_type == ET_DYN) {
        list.flags |= IPROBE_PL_FLAG_PIE;
        if (!shape.has_interp) list.flags |= IPROBE_PL_FLAG_SHARED;
    }
    std::error_code ignored;
    const auto absolute = std::filesystem::weakly_canonical(elf_path, ignored);
    list.module = !shape.soname.empty() ? shape.soname : (ignored ? elf_path : absolute.string());
    list.build_id = build_id(elf.get());

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
        std::copy(std::begin(kNop5), std::end(kNop5), probe.placeholder.begin());
        probe.original = probe.placeholder;
        std::uint8_t present[sizeof kNop5];
        if (!bytes_at(elf.get(), raw.site, present, sizeof present))
            throw corrupt(elf_path, "probe site of '" + raw.name + "' is outside the code");
        if (std::memcmp(present, kNop5, sizeof kNop5) != 0)
            throw Error(elf_path + ": probe site of '" + raw.name + "' does not hold the placeholder NOP; "
                                   "the binary was modified after linking",
                        ExitCode::bad_input);

        probe.function_address = raw.function;
        if (!probe.function_address)
            if (const Symbol* symbol = symbol_containing(symbols, raw.site)) probe.function_address = symbol->address;
        if (!probe.function_address && raw.kind != ProbeKind::point)
            if (auto it = entry_sites.find(raw.name); it != entry_sites.end()) probe.function_address = it->second;

        probe.function = raw.name;
        probe.demangled = raw.kind == ProbeKind::point ? raw.name : demangle(raw.name);
        if (lines.lookup(raw.site, probe.file, probe.line)) any_source = true;
        list.probes.push_back(std::move(probe));
    }
    if (any_source) list.flags |= IPROBE_PL_FLAG_DWARF;
    list.normalize();
    return list;
}

}  // namespace iprobe
