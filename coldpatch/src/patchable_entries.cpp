// The entry-NOP flow: gcc's -fpatchable-function-entry=5,0 pads each
// out-of-line function with five 1-byte NOPs and records their address in
// __patchable_function_entries.  Each pad becomes one 5-byte NOP (one
// instruction executed per call instead of five) and one entry probe.
#include <gelf.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "iprobe/coldpatch/coldpatch.h"
#include "source_lines.h"

namespace iprobe {

namespace {

constexpr std::uint8_t kPad[5] = {0x90, 0x90, 0x90, 0x90, 0x90};

// A PIE's or library's section holds link-time addresses through
// R_X86_64_RELATIVE relocations; GNU ld also writes them into the section,
// lld (without --apply-dynamic-relocs) leaves zeros there.
std::map<std::uint64_t, std::uint64_t> relative_addends(const ElfFile& elf, const ElfSection& table) {
    std::map<std::uint64_t, std::uint64_t> addends;
    for (const auto& s : elf.sections()) {
        if (s.type != SHT_RELA || s.entry_size == 0) continue;
        Elf_Data* data = elf_getdata(elf_getscn(elf.native_handle(), s.index), nullptr);
        if (!data) continue;
        for (std::size_t i = 0; i < s.size / s.entry_size; ++i) {
            GElf_Rela rela;
            if (!gelf_getrela(data, static_cast<int>(i), &rela)) break;
            if (GELF_R_TYPE(rela.r_info) == R_X86_64_RELATIVE && table.contains(rela.r_offset))
                addends[rela.r_offset] = static_cast<std::uint64_t>(rela.r_addend);
        }
    }
    return addends;
}

std::vector<std::uint64_t> pad_addresses(const ElfFile& elf, const ElfSection& table) {
    const auto bytes = elf.section_bytes(table);
    const auto addends = relative_addends(elf, table);
    std::vector<std::uint64_t> pads;
    for (std::size_t at = 0; at + 8 <= bytes.size(); at += 8) {
        std::uint64_t address = 0;
        std::memcpy(&address, bytes.data() + at, 8);
        if (auto it = addends.find(table.address + at); it != addends.end()) address = it->second;
        if (address != 0) pads.push_back(address);
    }
    std::sort(pads.begin(), pads.end());
    pads.erase(std::unique(pads.begin(), pads.end()), pads.end());
    return pads;
}

}  // namespace

bool has_patchable_entries(const ElfFile& elf) { return elf.section(kPatchableEntriesSection) != nullptr; }

std::vector<Probe> scan_patchable_entries(const ElfFile& elf, std::size_t& foreign_pads) {
    std::vector<Probe> probes;
    foreign_pads = 0;
    const ElfSection* table = elf.section(kPatchableEntriesSection);
    if (!table || !table->has_file_bytes()) return probes;
    SourceLines lines(elf);
    for (const std::uint64_t site : pad_addresses(elf, *table)) {
        const auto offset = elf.file_offset(site);
        const ElfSymbol* function = elf.function_at(site);
        if (!offset || *offset + sizeof kPad > elf.bytes().size() || !function) {
            ++foreign_pads;
            continue;
        }
        const std::uint8_t* now = elf.bytes().data() + *offset;
        // Only the pad iprobe-cc asks for (=5,0) or its coldpatched form;
        // other sizes (the kernel's, a function's own attribute) are not ours.
        if (std::memcmp(now, kPad, sizeof kPad) != 0 && std::memcmp(now, kNop5, sizeof kNop5) != 0) {
            ++foreign_pads;
            continue;
        }
        Probe p;
        p.kind = ProbeKind::entry;
        p.form = SiteForm::nop;
        p.size = sizeof kPad;
        p.site = site;
        p.function_address = function->address;
        p.function = function->name;
        p.demangled = demangle(function->name);
        std::copy(std::begin(kPad), std::end(kPad), p.original.begin());
        std::copy(std::begin(kNop5), std::end(kNop5), p.placeholder.begin());
        if (auto where = lines.at(site)) {
            p.file = where->file;
            p.line = where->line;
        }
        probes.push_back(std::move(p));
    }
    return probes;
}

}  // namespace iprobe
