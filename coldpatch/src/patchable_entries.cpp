// The entry-NOP flow: gcc's -fpatchable-function-entry=5,0 pads each
// out-of-line function with five 1-byte NOPs and records their address in
// __patchable_function_entries.  Each pad becomes one 5-byte NOP (one
// instruction executed per call instead of five), the function's entry
// probe, and its exit probe, which has no site of its own: the entry site
// hooks the return through a return trampoline (runtime/src/return_stack.h).
#include <elf.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "iprobe/coldpatch/coldpatch.h"
#include "iprobe/elf/demangle.h"
#include "iprobe/elf/source_lines.h"

namespace iprobe::coldpatch {

namespace {

constexpr std::uint8_t kPad[5] = {0x90, 0x90, 0x90, 0x90, 0x90};

}  // namespace

bool has_patchable_entries(const elf::ElfFile& elf) { return elf.section(kPatchableEntriesSection) != nullptr; }

std::vector<probelist::Probe> scan_patchable_entries(const elf::ElfFile& elf, std::size_t& foreign_pads) {
    std::vector<probelist::Probe> probes;
    foreign_pads = 0;
    const std::vector<std::uint64_t> pads = elf.patchable_entries();
    if (pads.empty()) return probes;
    elf::SourceLines lines(elf);
    for (const std::uint64_t site : pads) {
        const auto offset = elf.file_offset(site);
        const elf::ElfSymbol* function = elf.function_at(site);
        if (!offset || *offset + sizeof kPad > elf.bytes().size() || !function) {
            ++foreign_pads;
            continue;
        }
        const std::uint8_t* now = elf.bytes().data() + *offset;
        // Only the pad iprobe-cc asks for (=5,0): gcc's five 1-byte NOPs, or
        // one 5-byte NOP (clang's, or gcc's once coldpatched).  Other sizes
        // (the kernel's, a function's own attribute) are not ours.
        const bool single_nop = now[0] == 0x0f && now[1] == 0x1f && now[2] == 0x44 && now[3] == 0x00;
        if (std::memcmp(now, kPad, sizeof kPad) != 0 && !single_nop) {
            ++foreign_pads;
            continue;
        }
        probelist::Probe p;
        p.kind = probelist::ProbeKind::entry;
        p.form = probelist::SiteForm::nop;
        p.size = sizeof kPad;
        p.site = site;
        p.function_address = function->address;
        p.function = function->name;
        p.demangled = elf::demangle(function->name);
        if (single_nop && std::memcmp(now, kNop5, sizeof kNop5) != 0) {
            std::copy(now, now + sizeof kPad, p.original.begin());  // already one NOP: nothing to write
            p.placeholder = p.original;
        } else {
            std::copy(std::begin(kPad), std::end(kPad), p.original.begin());
            std::copy(std::begin(kNop5), std::end(kNop5), p.placeholder.begin());
        }
        if (auto where = lines.at(site)) {
            p.file = where->file;
            p.line = where->line;
        }
        probelist::Probe exit = p;
        exit.kind = probelist::ProbeKind::exit;
        exit.form = probelist::SiteForm::ret;
        probes.push_back(std::move(p));
        probes.push_back(std::move(exit));
    }
    return probes;
}

}  // namespace iprobe::coldpatch
