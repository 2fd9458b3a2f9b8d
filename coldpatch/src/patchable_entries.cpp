// The entry-NOP flow: gcc's -fpatchable-function-entry=5,0 pads each
// out-of-line function with five 1-byte NOPs at its first instruction (after
// endbr64).  Each pad becomes one 5-byte NOP (one instruction executed per
// call instead of five), the function's entry probe, and its exit probe,
// which has no site of its own: the entry site hooks the return through a
// return trampoline (runtime/src/return_stack.h).
//
// The pads are found from what the linker kept: every function symbol whose
// first instruction is the pad.  gcc's records (__patchable_function_entries)
// cannot be trusted after a link: gcc 12 puts one record section per object,
// tied to one text section, so a discarded COMDAT group either fails the link
// or takes the whole object's records with it.  iprobe-cc therefore discards
// the records at link time (docs/design.md §3); records still present (a link
// made without iprobe-cc) are read too.  Function starts from .eh_frame_hdr
// are an independent view: a pad there without a symbol is counted, never
// dropped silently.
#include <elf.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <set>

#include "iprobe/coldpatch/coldpatch.h"
#include "iprobe/elf/demangle.h"
#include "iprobe/elf/source_lines.h"

namespace iprobe::coldpatch {

namespace {

constexpr std::uint8_t kPad[5] = {0x90, 0x90, 0x90, 0x90, 0x90};
constexpr std::uint8_t kEndbr64[4] = {0xf3, 0x0f, 0x1e, 0xfa};

enum class PadForm { none, single_bytes, one_nop };

// Only the pad iprobe-cc asks for (=5,0): gcc's five 1-byte NOPs, or one
// 5-byte NOP (clang's, or gcc's once coldpatched).  Other sizes (the
// kernel's, a function's own attribute) are not ours.
PadForm pad_at(const elf::ElfFile& elf, std::uint64_t site) {
    const auto offset = elf.file_offset(site);
    if (!offset || *offset + sizeof kPad > elf.bytes().size()) return PadForm::none;
    const std::uint8_t* now = elf.bytes().data() + *offset;
    if (std::memcmp(now, kPad, sizeof kPad) == 0) return PadForm::single_bytes;
    if (now[0] == 0x0f && now[1] == 0x1f && now[2] == 0x44 && now[3] == 0x00) return PadForm::one_nop;
    return PadForm::none;
}

// Where the pad of a function starting at `start` lies: its first
// instruction, or the one after endbr64 (-fcf-protection).
std::optional<std::uint64_t> pad_of_function_at(const elf::ElfFile& elf, std::uint64_t start) {
    if (pad_at(elf, start) != PadForm::none) return start;
    const auto offset = elf.file_offset(start);
    if (offset && *offset + sizeof kEndbr64 <= elf.bytes().size() &&
        std::memcmp(elf.bytes().data() + *offset, kEndbr64, sizeof kEndbr64) == 0 &&
        pad_at(elf, start + sizeof kEndbr64) != PadForm::none)
        return start + sizeof kEndbr64;
    return std::nullopt;
}

bool in_code(const elf::ElfFile& elf, std::uint64_t address) {
    const elf::ElfSection* s = elf.section_containing(address);
    return s && s->executable();
}

// Pads at the start of a function symbol in an executable section.
std::set<std::uint64_t> padded_function_starts(const elf::ElfFile& elf) {
    std::set<std::uint64_t> pads;
    for (const auto& s : elf.symbols()) {
        if (!s.defined() || !s.is_function() || !in_code(elf, s.address)) continue;
        if (auto pad = pad_of_function_at(elf, s.address)) pads.insert(*pad);
    }
    return pads;
}

probelist::Probe entry_probe(const elf::ElfFile& elf, const elf::ElfSymbol& function, std::uint64_t site,
                             PadForm form, elf::SourceLines& lines) {
    probelist::Probe p;
    p.kind = probelist::ProbeKind::entry;
    p.form = probelist::SiteForm::nop;
    p.size = sizeof kPad;
    p.site = site;
    p.function_address = function.address;
    p.function = function.name;
    p.demangled = elf::demangle(function.name);
    const std::uint8_t* now = elf.bytes().data() + *elf.file_offset(site);
    if (form == PadForm::one_nop && std::memcmp(now, kNop5, sizeof kNop5) != 0) {
        std::copy(now, now + sizeof kPad, p.original.begin());  // already one NOP: nothing to write
        p.placeholder = p.original;
    } else {  // gcc's pad, or gcc's pad once coldpatched
        std::copy(std::begin(kPad), std::end(kPad), p.original.begin());
        std::copy(std::begin(kNop5), std::end(kNop5), p.placeholder.begin());
    }
    if (auto where = lines.at(site)) {
        p.file = where->file;
        p.line = where->line;
    }
    return p;
}

}  // namespace

PatchableEntryScan scan_patchable_entries(const elf::ElfFile& elf) {
    PatchableEntryScan scan;
    std::set<std::uint64_t> sites = padded_function_starts(elf);
    for (const std::uint64_t recorded : elf.patchable_entries()) {
        const elf::ElfSymbol* function = elf.function_at(recorded);
        if (!function || pad_at(elf, recorded) == PadForm::none) {
            ++scan.foreign_pads;
            continue;
        }
        sites.insert(recorded);
    }
    for (const std::uint64_t start : elf.unwind_starts()) {
        if (!in_code(elf, start)) continue;
        const auto pad = pad_of_function_at(elf, start);
        if (pad && !sites.contains(*pad) && !elf.function_at(*pad)) ++scan.unnamed_pads;
    }
    if (sites.empty()) return scan;
    elf::SourceLines lines(elf);
    for (const std::uint64_t site : sites) {
        const elf::ElfSymbol* function = elf.function_at(site);
        const PadForm form = pad_at(elf, site);
        if (!function || form == PadForm::none) {
            ++scan.foreign_pads;
            continue;
        }
        probelist::Probe entry = entry_probe(elf, *function, site, form, lines);
        probelist::Probe exit = entry;
        exit.kind = probelist::ProbeKind::exit;
        exit.form = probelist::SiteForm::ret;
        scan.probes.push_back(std::move(entry));
        scan.probes.push_back(std::move(exit));
    }
    return scan;
}

}  // namespace iprobe::coldpatch
