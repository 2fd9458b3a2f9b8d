#include "iprobe/elf/elf_file.h"

#include <capstone/capstone.h>
#include <gelf.h>
#include <libelf.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "dwarf_types.h"
#include "iprobe/support/error.h"
#include "iprobe/support/file.h"

namespace iprobe::elf {

namespace {

constexpr std::uint32_t kNoteGnuBuildId = 3;  // NT_GNU_BUILD_ID

[[noreturn]] void corrupt(const std::string& origin, const std::string& why) {
    throw Error(origin + ": truncated or corrupt ELF file (" + why + ")", ExitCode::bad_input);
}

std::string machine_name(std::uint16_t machine) {
    switch (machine) {
        case EM_X86_64: return "x86-64";
        case EM_386: return "i386";
        case EM_AARCH64: return "aarch64";
        case EM_ARM: return "arm";
        case EM_RISCV: return "riscv";
        case EM_PPC64: return "ppc64";
        case EM_S390: return "s390";
        default: return "machine " + std::to_string(machine);
    }
}

bool fits(std::uint64_t offset, std::uint64_t size, std::uint64_t total) {
    return offset <= total && size <= total - offset;
}

}  // namespace

bool ElfSection::executable() const { return (flags & SHF_EXECINSTR) != 0 && (flags & SHF_ALLOC) != 0; }
bool ElfSection::has_file_bytes() const { return type != SHT_NOBITS && type != SHT_NULL; }
bool ElfSymbol::is_function() const { return type == STT_FUNC || type == STT_GNU_IFUNC; }

void ElfFile::ElfCloser::operator()(Elf* e) const { elf_end(e); }

ElfFile::ElfFile(const std::string& path) : path_(path) {
    bytes_ = read_file(path);
    load(path);
}

ElfFile::ElfFile(std::vector<std::uint8_t> bytes, std::string origin)
    : path_(origin), bytes_(std::move(bytes)) {
    load(std::move(origin));
}

ElfFile::~ElfFile() = default;
ElfFile::ElfFile(ElfFile&&) noexcept = default;
ElfFile& ElfFile::operator=(ElfFile&& other) noexcept {
    // member by member would end this file's Elf before the Dwarf reading it
    if (this != &other) {
        std::destroy_at(this);
        std::construct_at(this, std::move(other));
    }
    return *this;
}

void ElfFile::FunctionDiesDeleter::operator()(FunctionDies* d) const { delete d; }

const FunctionDies* ElfFile::function_dies() const {
    if (!dwarf_read_) {
        dwarf_read_ = true;
        if (section(".debug_info") || section(".zdebug_info")) {
            auto dies = std::unique_ptr<FunctionDies, FunctionDiesDeleter>(new FunctionDies(elf_.get()));
            if (dies->dwarf()) function_dies_ = std::move(dies);
        }
    }
    return function_dies_.get();
}

void ElfFile::load(std::string origin) {
    if (bytes_.size() < 4 || std::memcmp(bytes_.data(), ELFMAG, SELFMAG) != 0)
        throw Error(origin + ": not an ELF file", ExitCode::bad_input);
    if (bytes_.size() < EI_NIDENT) corrupt(origin, "file ends inside the ELF identification");
    if (bytes_[EI_CLASS] != ELFCLASS64 && bytes_[EI_CLASS] != ELFCLASS32)
        corrupt(origin, "unknown ELF class");
    elf_version(EV_CURRENT);
    elf_.reset(elf_memory(reinterpret_cast<char*>(bytes_.data()), bytes_.size()));
    if (!elf_ || elf_kind(elf_.get()) != ELF_K_ELF) corrupt(origin, elf_errmsg(-1));
    GElf_Ehdr ehdr;
    if (!gelf_getehdr(elf_.get(), &ehdr)) corrupt(origin, std::string("ELF header: ") + elf_errmsg(-1));
    type_ = ehdr.e_type;
    machine_ = ehdr.e_machine;
    entry_point_ = ehdr.e_entry;
    const std::uint64_t total = bytes_.size();
    std::size_t shnum = 0, phnum = 0, shstrndx = 0;
    if (elf_getshdrnum(elf_.get(), &shnum) != 0) corrupt(origin, "section count unreadable");
    if (elf_getphdrnum(elf_.get(), &phnum) != 0) corrupt(origin, "segment count unreadable");
    // libelf quietly reports no sections when the table is cut off, so the
    // header's own numbers are checked against the file size.
    const std::uint64_t declared_sections = std::max<std::uint64_t>({shnum, ehdr.e_shnum, ehdr.e_shoff ? 1u : 0u});
    if (declared_sections && !fits(ehdr.e_shoff, declared_sections * ehdr.e_shentsize, total))
        corrupt(origin, "section header table lies past the end of the file");
    const std::uint64_t declared_segments = std::max<std::uint64_t>(phnum, ehdr.e_phnum);
    if (declared_segments && !fits(ehdr.e_phoff, declared_segments * ehdr.e_phentsize, total))
        corrupt(origin, "program header table lies past the end of the file");
    if (ehdr.e_shnum && shnum != ehdr.e_shnum) corrupt(origin, "section headers unreadable");
    if (shnum && elf_getshdrstrndx(elf_.get(), &shstrndx) != 0)
        corrupt(origin, "section name table unreadable");
    read_sections();
    for (const auto& s : sections_)
        if (s.has_file_bytes() && s.type != SHT_NULL && !fits(s.offset, s.size, total))
            corrupt(origin, "section " + (s.name.empty() ? std::to_string(s.index) : s.name) +
                                " lies past the end of the file");
    read_segments();
    for (const auto& p : segments_)
        if (!fits(p.offset, p.file_size, total)) corrupt(origin, "a segment lies past the end of the file");
    read_symbols();
}

void ElfFile::read_sections() {
    std::size_t shstrndx = 0;
    elf_getshdrstrndx(elf_.get(), &shstrndx);
    for (Elf_Scn* scn = elf_nextscn(elf_.get(), nullptr); scn; scn = elf_nextscn(elf_.get(), scn)) {
        GElf_Shdr shdr;
        if (!gelf_getshdr(scn, &shdr)) corrupt(path_, "section header unreadable");
        ElfSection s;
        s.index = elf_ndxscn(scn);
        const char* name = elf_strptr(elf_.get(), shstrndx, shdr.sh_name);
        s.name = name ? name : "";
        s.type = shdr.sh_type;
        s.flags = shdr.sh_flags;
        s.address = shdr.sh_addr;
        s.offset = shdr.sh_offset;
        s.size = shdr.sh_size;
        s.link = shdr.sh_link;
        s.entry_size = shdr.sh_entsize;
        sections_.push_back(std::move(s));
    }
}

void ElfFile::read_segments() {
    std::size_t phnum = 0;
    elf_getphdrnum(elf_.get(), &phnum);
    for (std::size_t i = 0; i < phnum; ++i) {
        GElf_Phdr phdr;
        if (!gelf_getphdr(elf_.get(), static_cast<int>(i), &phdr)) corrupt(path_, "program header unreadable");
        segments_.push_back({phdr.p_type, phdr.p_flags, phdr.p_offset, phdr.p_vaddr, phdr.p_filesz,
                             phdr.p_memsz, phdr.p_align});
    }
}

void ElfFile::read_symbols() {
    for (const auto& s : sections_) {
        if (s.type != SHT_SYMTAB && s.type != SHT_DYNSYM) continue;
        Elf_Scn* scn = elf_getscn(elf_.get(), s.index);
        Elf_Data* data = scn ? elf_getdata(scn, nullptr) : nullptr;
        if (!data || s.entry_size == 0) continue;
        const std::size_t count = s.size / s.entry_size;
        for (std::size_t i = 1; i < count; ++i) {
            GElf_Sym sym;
            if (!gelf_getsym(data, static_cast<int>(i), &sym)) corrupt(path_, "symbol table unreadable");
            const char* name = elf_strptr(elf_.get(), s.link, sym.st_name);
            if (!name || !*name) continue;
            symbols_.push_back({name, sym.st_value, sym.st_size, static_cast<std::uint8_t>(GELF_ST_TYPE(sym.st_info)),
                                static_cast<std::uint8_t>(GELF_ST_BIND(sym.st_info)), sym.st_shndx,
                                s.type == SHT_DYNSYM});
        }
    }
    // Within one address the preferred name comes first: static table over
    // dynamic, global over weak over local.
    auto rank = [](const ElfSymbol& s) {
        return (s.dynamic ? 4 : 0) + (s.bind == STB_GLOBAL ? 0 : s.bind == STB_WEAK ? 1 : 2);
    };
    std::stable_sort(symbols_.begin(), symbols_.end(), [&](const ElfSymbol& a, const ElfSymbol& b) {
        if (a.defined() != b.defined()) return a.defined();
        if (a.address != b.address) return a.address < b.address;
        return rank(a) < rank(b);
    });
    for (std::size_t i = 0; i < symbols_.size(); ++i) {
        const auto& s = symbols_[i];
        if (!s.defined() || !s.is_function() || s.section >= SHN_LORESERVE) continue;
        if (!functions_by_address_.empty() && symbols_[functions_by_address_.back()].address == s.address) {
            auto& kept = symbols_[functions_by_address_.back()];
            if (kept.size == 0 && s.size != 0) kept.size = s.size;
            continue;
        }
        functions_by_address_.push_back(i);
    }
}

bool ElfFile::is_x86_64() const { return machine_ == EM_X86_64 && bytes_[EI_CLASS] == ELFCLASS64; }
bool ElfFile::is_executable_or_library() const { return type_ == ET_EXEC || type_ == ET_DYN; }
bool ElfFile::is_position_independent() const { return type_ == ET_DYN; }

namespace {

template <typename Fn>
void for_each_dynamic(Elf* elf, const std::vector<ElfSection>& sections, Fn&& fn) {
    for (const auto& s : sections) {
        if (s.type != SHT_DYNAMIC || s.entry_size == 0) continue;
        Elf_Data* data = elf_getdata(elf_getscn(elf, s.index), nullptr);
        if (!data) continue;
        for (std::size_t i = 0; i < s.size / s.entry_size; ++i) {
            GElf_Dyn dyn;
            if (!gelf_getdyn(data, static_cast<int>(i), &dyn) || dyn.d_tag == DT_NULL) break;
            fn(dyn, s);
        }
    }
}

}  // namespace

bool ElfFile::is_shared_library() const {
    if (type_ != ET_DYN) return false;
    for (const auto& p : segments_)
        if (p.type == PT_INTERP) return false;
    bool pie = false;
    for_each_dynamic(elf_.get(), sections_, [&](const GElf_Dyn& dyn, const ElfSection&) {
        if (dyn.d_tag == DT_FLAGS_1 && (dyn.d_un.d_val & DF_1_PIE)) pie = true;
    });
    return !pie;
}

std::string ElfFile::soname() const {
    std::string name;
    for_each_dynamic(elf_.get(), sections_, [&](const GElf_Dyn& dyn, const ElfSection& s) {
        if (dyn.d_tag != DT_SONAME) return;
        if (const char* p = elf_strptr(elf_.get(), s.link, dyn.d_un.d_val)) name = p;
    });
    return name;
}

void ElfFile::require_x86_64_executable_or_library() const {
    if (!is_x86_64()) {
        const bool wide = bytes_[EI_CLASS] == ELFCLASS64;
        throw Error(path_ + ": is a " + (wide ? "64" : "32") + "-bit ELF file for " + machine_name(machine_) +
                        (machine_ == EM_X86_64 && !wide ? " (its class byte says 32-bit: x32 or corrupt)" : "") +
                        "; iprobe handles x86-64 only",
                    ExitCode::bad_input);
    }
    if (!is_executable_or_library())
        throw Error(path_ + ": is not a linked executable or shared library (ELF type " +
                        std::to_string(type_) + "); link it first",
                    ExitCode::bad_input);
}

std::vector<std::uint8_t> ElfFile::build_id() const {
    for (const auto& s : sections_) {
        if (s.type != SHT_NOTE) continue;
        Elf_Data* data = elf_getdata(elf_getscn(elf_.get(), s.index), nullptr);
        if (!data) continue;
        std::size_t offset = 0, name_offset = 0, desc_offset = 0;
        GElf_Nhdr note;
        while ((offset = gelf_getnote(data, offset, &note, &name_offset, &desc_offset)) > 0) {
            const char* owner = static_cast<const char*>(data->d_buf) + name_offset;
            if (note.n_type == kNoteGnuBuildId && note.n_namesz == 4 && std::memcmp(owner, "GNU", 4) == 0) {
                const auto* desc = static_cast<const std::uint8_t*>(data->d_buf) + desc_offset;
                return {desc, desc + note.n_descsz};
            }
        }
    }
    return {};
}

std::string ElfFile::build_id_hex() const {
    static constexpr char digits[] = "0123456789abcdef";
    std::string out;
    for (const auto b : build_id()) {
        out += digits[b >> 4];
        out += digits[b & 15];
    }
    return out;
}

const ElfSection* ElfFile::section(std::string_view name) const {
    for (const auto& s : sections_)
        if (s.name == name) return &s;
    return nullptr;
}

const ElfSection* ElfFile::section_containing(std::uint64_t vaddr) const {
    for (const auto& s : sections_)
        if ((s.flags & SHF_ALLOC) && s.contains(vaddr)) return &s;
    return nullptr;
}

std::span<const std::uint8_t> ElfFile::section_bytes(const ElfSection& s) const {
    // Sections with bytes were checked to lie inside the file when it was
    // read; anything else has none (a hostile header never reads past it).
    if (!s.has_file_bytes() || s.offset > bytes_.size() || s.size > bytes_.size() - s.offset) return {};
    return std::span<const std::uint8_t>(bytes_).subspan(s.offset, s.size);
}

std::vector<ElfSegment> ElfFile::load_segments() const {
    std::vector<ElfSegment> out;
    for (const auto& p : segments_)
        if (p.type == PT_LOAD) out.push_back(p);
    return out;
}

// The kernel maps each segment from its page (not p_align) boundary, so that
// is what a mapping's start corresponds to.
std::uint64_t ElfFile::first_load_vaddr() const {
    std::optional<std::uint64_t> lowest;
    for (const auto& p : segments_)
        if (p.type == PT_LOAD && (!lowest || p.vaddr < *lowest)) lowest = p.vaddr;
    return lowest.value_or(0) & ~std::uint64_t{0xfff};
}

std::optional<std::uint64_t> ElfFile::file_offset(std::uint64_t vaddr) const {
    for (const auto& p : segments_)
        if (p.type == PT_LOAD && vaddr >= p.vaddr && vaddr - p.vaddr < p.file_size)
            return p.offset + (vaddr - p.vaddr);
    return std::nullopt;
}

const ElfSymbol* ElfFile::function_at(std::uint64_t vaddr) const {
    auto it = std::upper_bound(functions_by_address_.begin(), functions_by_address_.end(), vaddr,
                               [&](std::uint64_t a, std::size_t i) { return a < symbols_[i].address; });
    if (it == functions_by_address_.begin()) return nullptr;
    const ElfSymbol& s = symbols_[*std::prev(it)];
    if (s.size != 0) return vaddr - s.address < s.size ? &s : nullptr;
    const ElfSection* here = section_containing(vaddr);
    return here && here->contains(s.address) ? &s : nullptr;
}

const ElfSymbol* ElfFile::function_starting_at(std::uint64_t vaddr) const {
    auto it = std::lower_bound(functions_by_address_.begin(), functions_by_address_.end(), vaddr,
                               [&](std::size_t i, std::uint64_t a) { return symbols_[i].address < a; });
    if (it == functions_by_address_.end() || symbols_[*it].address != vaddr) return nullptr;
    return &symbols_[*it];
}

const ElfSymbol* ElfFile::symbol_named(std::string_view name) const {
    const ElfSymbol* found = nullptr;
    for (const auto& s : symbols_) {
        if (!s.defined() || s.name != name) continue;
        if (!s.dynamic) return &s;
        if (!found) found = &s;
    }
    return found;
}

void ElfFile::read_relocations() const {
    if (relocations_read_) return;
    relocations_read_ = true;
    for (const auto& s : sections_) {
        if (s.type != SHT_RELA || s.entry_size == 0 || s.link == 0) continue;
        Elf_Data* data = elf_getdata(elf_getscn(elf_.get(), s.index), nullptr);
        Elf_Scn* symscn = elf_getscn(elf_.get(), s.link);
        Elf_Data* symdata = symscn ? elf_getdata(symscn, nullptr) : nullptr;
        GElf_Shdr symshdr;
        if (!data || !symdata || !gelf_getshdr(symscn, &symshdr) || symshdr.sh_type != SHT_DYNSYM) continue;
        for (std::size_t i = 0; i < s.size / s.entry_size; ++i) {
            GElf_Rela rela;
            if (!gelf_getrela(data, static_cast<int>(i), &rela)) break;
            const auto type = static_cast<std::uint32_t>(GELF_R_TYPE(rela.r_info));
            if (type != R_X86_64_JUMP_SLOT && type != R_X86_64_GLOB_DAT) continue;
            GElf_Sym sym;
            if (!gelf_getsym(symdata, static_cast<int>(GELF_R_SYM(rela.r_info)), &sym)) continue;
            const char* name = elf_strptr(elf_.get(), symshdr.sh_link, sym.st_name);
            got_slots_.push_back({rela.r_offset, name ? name : "", type});
        }
    }
    std::sort(got_slots_.begin(), got_slots_.end(),
              [](const GotSlot& a, const GotSlot& b) { return a.address < b.address; });
}

const std::vector<GotSlot>& ElfFile::got_slots() const {
    read_relocations();
    return got_slots_;
}

const GotSlot* ElfFile::got_slot_at(std::uint64_t vaddr) const {
    const auto& slots = got_slots();
    auto it = std::lower_bound(slots.begin(), slots.end(), vaddr,
                               [](const GotSlot& s, std::uint64_t a) { return s.address < a; });
    return it != slots.end() && it->address == vaddr ? &*it : nullptr;
}

// PLT stubs are found by decoding them (jmp *slot(%rip), possibly after an
// endbr64), not by assuming one stub layout: .plt, .plt.sec (IBT) and
// .plt.got all differ.
void ElfFile::read_plt() const {
    if (plt_read_) return;
    plt_read_ = true;
    if (!is_x86_64()) return;
    csh handle;
    if (cs_open(CS_ARCH_X86, CS_MODE_64, &handle) != CS_ERR_OK) return;
    cs_option(handle, CS_OPT_DETAIL, CS_OPT_ON);
    cs_insn* insn = cs_malloc(handle);
    for (const auto& s : sections_) {
        if (!s.executable() || !(s.name == ".plt" || s.name == ".plt.sec" || s.name == ".plt.got")) continue;
        const auto code = section_bytes(s);
        const std::uint8_t* p = code.data();
        std::size_t left = code.size();
        std::uint64_t address = s.address;
        std::uint64_t previous_endbr_end = 0, previous_endbr = 0;
        while (left > 0) {
            if (!cs_disasm_iter(handle, &p, &left, &address, insn)) {
                ++p, --left, ++address;
                continue;
            }
            if (insn->id == X86_INS_ENDBR64) {
                previous_endbr = insn->address;
                previous_endbr_end = insn->address + insn->size;
                continue;
            }
            const cs_x86& x86 = insn->detail->x86;
            if (insn->id == X86_INS_JMP && x86.op_count == 1 && x86.operands[0].type == X86_OP_MEM &&
                x86.operands[0].mem.base == X86_REG_RIP && x86.operands[0].mem.index == X86_REG_INVALID) {
                const std::uint64_t slot = insn->address + insn->size + x86.operands[0].mem.disp;
                if (const GotSlot* got = got_slot_at(slot)) {
                    const std::uint64_t entry = previous_endbr_end == insn->address ? previous_endbr : insn->address;
                    plt_entries_.push_back({entry, slot, got->symbol});
                }
            }
        }
    }
    cs_free(insn, 1);
    cs_close(&handle);
    std::sort(plt_entries_.begin(), plt_entries_.end(),
              [](const PltEntry& a, const PltEntry& b) { return a.address < b.address; });
}

const std::vector<PltEntry>& ElfFile::plt_entries() const {
    read_plt();
    return plt_entries_;
}

const PltEntry* ElfFile::plt_entry_at(std::uint64_t vaddr) const {
    const auto& entries = plt_entries();
    auto it = std::lower_bound(entries.begin(), entries.end(), vaddr,
                               [](const PltEntry& e, std::uint64_t a) { return e.address < a; });
    return it != entries.end() && it->address == vaddr ? &*it : nullptr;
}


std::map<std::uint64_t, std::uint64_t> ElfFile::relative_addends(const ElfSection& within) const {
    std::map<std::uint64_t, std::uint64_t> addends;
    for (const auto& s : sections_) {
        if (s.type != SHT_RELA || s.entry_size == 0) continue;
        Elf_Data* data = elf_getdata(elf_getscn(elf_.get(), s.index), nullptr);
        if (!data) continue;
        for (std::size_t i = 0; i < s.size / s.entry_size; ++i) {
            GElf_Rela rela;
            if (!gelf_getrela(data, static_cast<int>(i), &rela)) break;
            if (GELF_R_TYPE(rela.r_info) == R_X86_64_RELATIVE && within.contains(rela.r_offset))
                addends[rela.r_offset] = static_cast<std::uint64_t>(rela.r_addend);
        }
    }
    return addends;
}

std::vector<std::uint64_t> ElfFile::patchable_entries() const {
    std::vector<std::uint64_t> pads;
    const ElfSection* table = section("__patchable_function_entries");
    if (!table || !table->has_file_bytes()) return pads;
    const auto bytes = section_bytes(*table);
    const auto addends = relative_addends(*table);
    for (std::size_t at = 0; at + 8 <= bytes.size(); at += 8) {
        std::uint64_t address = 0;
        std::memcpy(&address, bytes.data() + at, 8);
        if (auto it = addends.find(table->address + at); it != addends.end()) address = it->second;
        if (address != 0) pads.push_back(address);
    }
    std::sort(pads.begin(), pads.end());
    pads.erase(std::unique(pads.begin(), pads.end()), pads.end());
    return pads;
}

std::vector<std::uint64_t> ElfFile::unwind_starts() const {
    // .eh_frame_hdr: version 1, eh_frame_ptr_enc, fde_count_enc, table_enc,
    // eh_frame_ptr, fde_count, then (initial location, FDE) pairs, each
    // relative to the section's start (DW_EH_PE_datarel | DW_EH_PE_sdata4).
    constexpr std::uint8_t kUdata4 = 0x03, kSdata4 = 0x0b, kPcrel = 0x10, kDatarel = 0x30;
    std::vector<std::uint64_t> starts;
    const ElfSection* hdr = section(".eh_frame_hdr");
    if (!hdr) return starts;
    const auto bytes = section_bytes(*hdr);
    if (bytes.size() < 12 || bytes[0] != 1 || (bytes[1] & 0x0f) != kSdata4 || bytes[2] != kUdata4 ||
        bytes[3] != (kDatarel | kSdata4) || (bytes[1] & 0x70 & ~kPcrel) != 0)
        return starts;
    std::uint32_t count = 0;
    std::memcpy(&count, bytes.data() + 8, 4);
    if (count > (bytes.size() - 12) / 8) return starts;
    starts.reserve(count);
    for (std::uint32_t i = 0; i < count; ++i) {
        std::int32_t relative = 0;
        std::memcpy(&relative, bytes.data() + 12 + 8 * std::size_t{i}, 4);
        starts.push_back(hdr->address + static_cast<std::uint64_t>(static_cast<std::int64_t>(relative)));
    }
    std::sort(starts.begin(), starts.end());
    starts.erase(std::unique(starts.begin(), starts.end()), starts.end());
    return starts;
}

}  // namespace iprobe::elf
