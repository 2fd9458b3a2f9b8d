// Read-only view of an x86-64 (or any) ELF file through libelf: validity
// checks, GNU build-id, sections, symbols (static and dynamic), PT_LOAD
// segments, relocations, and where PLT entries and GOT slots lead.  The one
// ELF reader of the tree: coldpatch (finds placeholder calls), probelist (the
// LLVM flow's site section), hotpatch (build-ids, routing) and fperf
// (symbolizing) all read files through it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

struct Elf;

namespace iprobe::elf {

class FunctionDies;  // elf/src/dwarf_types.h

struct ElfSection {
    std::size_t index = 0;
    std::string name;
    std::uint32_t type = 0;     // SHT_*
    std::uint64_t flags = 0;    // SHF_*
    std::uint64_t address = 0;  // sh_addr
    std::uint64_t offset = 0;   // sh_offset
    std::uint64_t size = 0;
    std::uint32_t link = 0;
    std::uint64_t entry_size = 0;

    bool executable() const;
    bool has_file_bytes() const;  // not SHT_NOBITS or SHT_NULL
    bool contains(std::uint64_t vaddr) const { return vaddr >= address && vaddr - address < size; }
};

struct ElfSymbol {
    std::string name;
    std::uint64_t address = 0;
    std::uint64_t size = 0;
    std::uint8_t type = 0;   // STT_*
    std::uint8_t bind = 0;   // STB_*
    std::uint16_t section = 0;  // st_shndx; SHN_UNDEF for imports
    bool dynamic = false;    // from .dynsym

    bool defined() const { return section != 0; }
    bool is_function() const;
};

struct ElfSegment {
    std::uint32_t type = 0;   // PT_*
    std::uint32_t flags = 0;  // PF_*
    std::uint64_t offset = 0;
    std::uint64_t vaddr = 0;
    std::uint64_t file_size = 0;
    std::uint64_t mem_size = 0;
    std::uint64_t align = 0;
};

// A GOT slot the dynamic linker fills with an imported symbol's address.
struct GotSlot {
    std::uint64_t address = 0;   // link-time vaddr of the slot
    std::string symbol;
    std::uint32_t reloc_type = 0;  // R_X86_64_JUMP_SLOT, R_X86_64_GLOB_DAT, ...
};

// A PLT entry (.plt, .plt.sec or .plt.got): calling `address` jumps through
// `got_slot` to `symbol`.
struct PltEntry {
    std::uint64_t address = 0;
    std::uint64_t got_slot = 0;
    std::string symbol;
};

class ElfFile {
public:
    // Reads and validates `path`.  Throws Error(bad_input) saying what is
    // wrong for a non-ELF, truncated or corrupt file; Error(not_found) when
    // it does not exist.  Any machine is accepted: check machine() yourself.
    explicit ElfFile(const std::string& path);
    // Same checks on bytes already in memory (`origin` names them in errors).
    ElfFile(std::vector<std::uint8_t> bytes, std::string origin);
    ~ElfFile();
    ElfFile(ElfFile&&) noexcept;
    ElfFile& operator=(ElfFile&&) noexcept;
    ElfFile(const ElfFile&) = delete;
    ElfFile& operator=(const ElfFile&) = delete;

    const std::string& path() const { return path_; }
    std::span<const std::uint8_t> bytes() const { return bytes_; }
    Elf* native_handle() const { return elf_.get(); }  // for libdw; owned here

    std::uint16_t type() const { return type_; }        // ET_EXEC, ET_DYN, ...
    std::uint16_t machine() const { return machine_; }  // EM_X86_64, ...
    // e_entry: where the kernel (or ld.so) starts the program; 0 when none.
    std::uint64_t entry_point() const { return entry_point_; }
    bool is_x86_64() const;
    bool is_executable_or_library() const;  // ET_EXEC or ET_DYN
    bool is_position_independent() const;   // ET_DYN
    // ET_DYN without PT_INTERP and without DF_1_PIE: a library, not a PIE.
    bool is_shared_library() const;
    std::string soname() const;  // DT_SONAME, empty when absent
    // Throws Error(bad_input) unless this is an x86-64 ET_EXEC/ET_DYN.
    void require_x86_64_executable_or_library() const;

    std::vector<std::uint8_t> build_id() const;  // empty when there is none
    std::string build_id_hex() const;

    const std::vector<ElfSection>& sections() const { return sections_; }
    const ElfSection* section(std::string_view name) const;
    const ElfSection* section_containing(std::uint64_t vaddr) const;  // allocated sections only
    std::span<const std::uint8_t> section_bytes(const ElfSection& section) const;

    const std::vector<ElfSegment>& segments() const { return segments_; }
    std::vector<ElfSegment> load_segments() const;
    std::uint64_t first_load_vaddr() const;  // the vaddr a load bias is measured from
    std::optional<std::uint64_t> file_offset(std::uint64_t vaddr) const;

    // .symtab and .dynsym together, sorted by address (defined first).
    const std::vector<ElfSymbol>& symbols() const { return symbols_; }
    // The defined function symbol whose [address, address+size) holds `vaddr`
    // (or, for size-0 symbols, the nearest one below it in the same section).
    const ElfSymbol* function_at(std::uint64_t vaddr) const;
    // A defined function symbol starting exactly at `vaddr`.
    const ElfSymbol* function_starting_at(std::uint64_t vaddr) const;
    // Defined symbol by name (static table preferred), nullptr if absent.
    const ElfSymbol* symbol_named(std::string_view name) const;

    // Relocated GOT slots (JUMP_SLOT, GLOB_DAT) and the PLT entries using them.
    const std::vector<GotSlot>& got_slots() const;
    const std::vector<PltEntry>& plt_entries() const;
    const GotSlot* got_slot_at(std::uint64_t vaddr) const;
    const PltEntry* plt_entry_at(std::uint64_t vaddr) const;
    // R_X86_64_RELATIVE addends of the slots inside `within`, by slot address:
    // a PIE's link-time pointers where the linker left zeros in the section.
    std::map<std::uint64_t, std::uint64_t> relative_addends(const ElfSection& within) const;

    // The addresses __patchable_function_entries lists (-fpatchable-function-entry,
    // the LLVM pass's attribute: each function's entry NOPs), sorted and
    // unique; relocated where the linker left zeros.  Empty without the section.
    std::vector<std::uint64_t> patchable_entries() const;

    // Where each function with unwind information starts: the initial
    // locations of .eh_frame_hdr's search table (gcc and clang give every
    // function one), sorted.  An independent view of the functions, for a
    // binary whose symbols are stripped.  Empty without the table or in an
    // encoding other than the linkers' (datarel sdata4).
    std::vector<std::uint64_t> unwind_starts() const;

    // The file's DWARF as libdw reads it, opened and its functions indexed
    // on first use, then kept: for the DWARF readers of this library
    // (function_values.h, function_signature.h).  Null without .debug_info.
    // Like the relocations and PLT, read on first use: not from two threads at once.
    const FunctionDies* function_dies() const;

private:
    void load(std::string origin);
    void read_sections();
    void read_segments();
    void read_symbols();
    void read_relocations() const;
    void read_plt() const;

    struct ElfCloser {
        void operator()(Elf* e) const;
    };

    std::string path_;
    std::vector<std::uint8_t> bytes_;
    std::unique_ptr<Elf, ElfCloser> elf_;
    std::uint16_t type_ = 0;
    std::uint16_t machine_ = 0;
    std::uint64_t entry_point_ = 0;
    std::vector<ElfSection> sections_;
    std::vector<ElfSegment> segments_;
    std::vector<ElfSymbol> symbols_;
    std::vector<std::size_t> functions_by_address_;  // indexes into symbols_
    mutable bool relocations_read_ = false;
    mutable std::vector<GotSlot> got_slots_;
    mutable bool plt_read_ = false;
    mutable std::vector<PltEntry> plt_entries_;
    struct FunctionDiesDeleter {
        void operator()(FunctionDies* d) const;
    };
    // after elf_: its Dwarf reads elf_, so it goes first
    mutable bool dwarf_read_ = false;
    mutable std::unique_ptr<FunctionDies, FunctionDiesDeleter> function_dies_;
};

}  // namespace iprobe::elf
