#include "iprobe/probelist/symbol_probes.h"

#include <elf.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <string>

#include "iprobe/elf/demangle.h"
#include "iprobe/elf/elf_file.h"
#include "iprobe/elf/source_lines.h"
#include "iprobe/relocate/entry_relocation.h"
#include "iprobe/support/error.h"

namespace iprobe::probelist {

namespace {

// Of several names for one address (malloc and __libc_malloc), the one a
// user would type: global before local, fewer leading underscores, shorter.
bool better_name(const elf::ElfSymbol& a, const elf::ElfSymbol& b) {
    const bool a_local = a.bind == STB_LOCAL, b_local = b.bind == STB_LOCAL;
    if (a_local != b_local) return !a_local;
    auto underscores = [](const std::string& n) { return n.find_first_not_of('_'); };
    if (underscores(a.name) != underscores(b.name)) return underscores(a.name) < underscores(b.name);
    return a.name.size() < b.name.size();
}

// Function symbols with a size in executable sections, one per address.
std::vector<const elf::ElfSymbol*> functions_of(const elf::ElfFile& elf) {
    std::vector<const elf::ElfSymbol*> out;
    for (const elf::ElfSymbol& s : elf.symbols()) {
        // An IFUNC symbol is its resolver, run once by the loader.
        if (!s.defined() || s.type != STT_FUNC || s.size == 0 || s.section >= SHN_LORESERVE) continue;
        const elf::ElfSection* section = elf.section_containing(s.address);
        if (!section || !section->executable() || !section->has_file_bytes()) continue;
        if (!out.empty() && out.back()->address == s.address) {
            if (better_name(s, *out.back())) out.back() = &s;
            continue;
        }
        out.push_back(&s);
    }
    std::sort(out.begin(), out.end(), [](auto* a, auto* b) { return a->address < b->address; });
    out.erase(std::unique(out.begin(), out.end(), [](auto* a, auto* b) { return a->address == b->address; }), out.end());
    return out;
}

// gcc's split-off cold code (foo.cold, foo.cold.3): reached by a jump from
// its function, never called.
bool is_cold_part(const std::string& name) {
    const auto dot = name.find(".cold");
    return dot != std::string::npos && (dot + 5 == name.size() || name[dot + 5] == '.');
}

// Why `f` is entered with something other than a return address at the
// stack pointer (nullopt when it is called, as a function is): a hooked
// return would overwrite that word, and the function never returns anyway.
std::optional<std::string> entered_without_return_address(const elf::ElfFile& elf, const elf::ElfSymbol& f) {
    if (elf.entry_point() != 0 && f.address == elf.entry_point())
        return "the program's entry point: the kernel starts it with argc where a call leaves a return address";
    if (f.name == "__restore_rt")
        return "the signal return: a handler's ret enters it with the signal frame where a return address would be";
    if (f.name.starts_with("_dl_runtime_resolve") || f.name.starts_with("_dl_runtime_profile"))
        return "lazy binding: a PLT entry jumps to it with the symbol's index where a return address would be";
    return std::nullopt;
}

// A Go program or library (the Go linker's function table is there):
// goroutines run on stacks of a few KiB that the runtime checks in each
// function's prologue, grows by moving them, and scans by return address
// (garbage collection, panics, tracebacks).  A probe's handler runs on that
// stack before the check, and a hooked return is a PC the runtime knows no
// function of ("fatal error: unknown pc"): Go's functions are refused.  The
// C that cgo links beside them runs on threads' own stacks and is probed.
class GoCode {
public:
    explicit GoCode(const elf::ElfFile& elf) : go_(elf.section(".gopclntab") != nullptr) {
        if (!go_) return;
        // The Go linker brackets Go's code (its assembly included) with these.
        for (const elf::ElfSymbol& s : elf.symbols()) {
            if (s.name == "runtime.text") low_ = s.address;
            if (s.name == "runtime.etext") high_ = s.address;
        }
    }
    bool holds(const elf::ElfSymbol& f) const {
        if (!go_) return false;
        if (low_ && high_ > low_) return f.address >= low_ && f.address < high_;
        return named_by_package(f.name);
    }

private:
    // Without the brackets: Go names its functions by package (main.main,
    // net/http.(*Server).Serve, type:.eq.T); C's have no dot but gcc's
    // clone suffixes (foo.isra.0, foo.part.1, foo.constprop.0, foo.cold).
    static bool named_by_package(const std::string& name) {
        if (name.find(':') != std::string::npos) return true;
        const auto dot = name.find('.');
        if (dot == std::string::npos) return false;
        for (std::string_view clone : {"isra.", "part.", "constprop.", "cold", "lto_priv.", "localalias"})
            if (std::string_view(name).substr(dot + 1).starts_with(clone)) return false;
        return true;
    }
    bool go_;
    std::uint64_t low_ = 0, high_ = 0;
};

}  // namespace

std::set<std::uint64_t> marked_unpadded(const elf::ElfFile& elf) {
    constexpr std::string_view kSuffix = IPROBE_UNPADDED_MARKER;
    std::set<std::uint64_t> starts;
    for (const elf::ElfSymbol& s : elf.symbols()) {
        if (!s.defined() || s.type != STT_NOTYPE || !s.name.ends_with(kSuffix)) continue;
        const elf::ElfSymbol* f = elf.function_at(s.address);
        // The label is the first instruction: the function's, or after its endbr64.
        if (f && (f->address == s.address || f->address + 4 == s.address)) starts.insert(f->address);
    }
    return starts;
}

RelocatedEntries relocated_entries(const elf::ElfFile& elf, const std::set<std::uint64_t>* only) {
    std::vector<const elf::ElfSymbol*> functions = functions_of(elf);
    RelocatedEntries out;
    if (functions.empty()) return out;

    std::vector<relocate::CodeRange> code;
    for (const elf::ElfSection& s : elf.sections())
        if (s.executable() && s.has_file_bytes() && s.address != 0) code.push_back({s.address, elf.section_bytes(s)});
    std::sort(code.begin(), code.end(), [](auto& a, auto& b) { return a.address < b.address; });
    std::vector<relocate::FunctionRange> ranges;
    ranges.reserve(functions.size());
    for (const elf::ElfSymbol* f : functions) ranges.push_back({f->address, f->size});
    const auto read = [&elf](std::uint64_t address, void* out, std::size_t size) {
        const auto offset = elf.file_offset(address);
        const auto end = elf.file_offset(address + size - 1);
        if (!offset || !end || *end != *offset + size - 1 || *offset + size > elf.bytes().size()) return false;
        std::memcpy(out, elf.bytes().data() + *offset, size);
        return true;
    };
    const std::vector<relocate::EntryPlan> plans = relocate::plan_entries(code, ranges, read);

    const elf::SourceLines lines(elf);
    const GoCode go(elf);
    // Every function is planned (each is a place branches come from), those
    // not in `only` are left out here.
    for (std::size_t i = 0; i < functions.size(); i++) {
        const elf::ElfSymbol& f = *functions[i];
        const relocate::EntryPlan& plan = plans[i];
        if (only && !only->contains(f.address)) continue;
        if (is_cold_part(f.name)) {
            out.refused.push_back({f.name, elf::demangle(f.name), f.address, f.size, "cold part",
                                   "code gcc split off its function, entered by a jump: no call to count"});
            continue;
        }
        if (go.holds(f)) {
            out.refused.push_back({f.name, elf::demangle(f.name), f.address, f.size, "go function",
                                   "goroutine stacks are small, moved and scanned by return address"});
            continue;
        }
        if (auto why = entered_without_return_address(elf, f)) {
            out.refused.push_back({f.name, elf::demangle(f.name), f.address, f.size, "no return address", *why});
            continue;
        }
        if (!plan.ok()) {
            out.refused.push_back({f.name, elf::demangle(f.name), f.address, f.size,
                                   std::string(relocate::to_string(plan.refusal)), plan.detail});
            continue;
        }
        Probe p;
        p.kind = ProbeKind::entry;
        p.form = SiteForm::nop;
        p.size = relocate::kJumpSize;
        p.relocated = true;
        p.site = f.address + plan.skip;
        p.function_address = f.address;
        p.function = f.name;
        p.demangled = elf::demangle(f.name);
        p.moved.resize(plan.length);
        if (!read(p.site, p.moved.data(), plan.length)) continue;  // inside a section: never
        std::array<std::uint8_t, IPROBE_PL_SITE_MAX> first{};
        std::copy_n(p.moved.begin(), std::min<std::size_t>(plan.length, first.size()), first.begin());
        if (plan.length < first.size()) read(p.site, first.data(), first.size());
        p.original = p.placeholder = first;
        if (auto where = lines.at(f.address)) {
            p.file = where->file;
            p.line = where->line;
            out.any_line = true;
        }
        Probe exit = p;
        exit.kind = ProbeKind::exit;
        exit.form = SiteForm::ret;
        exit.relocated = false;
        exit.moved.clear();
        out.probes.push_back(std::move(p));
        out.probes.push_back(std::move(exit));
    }
    return out;
}

ProbeList probes_from_symbols(const std::string& path) {
    const elf::ElfFile elf(path);
    elf.require_x86_64_executable_or_library();
    if (functions_of(elf).empty())
        throw NoFunctionSymbols(path + ": no probes: it was not built with iprobe-cc and has no function symbols (stripped of "
                           ".symtab and .dynsym); install its debug symbols or build it with iprobe-cc",
                    ExitCode::bad_input);
    RelocatedEntries entries = relocated_entries(elf);
    ProbeList list;
    list.flow = IPROBE_FLOW_UNPREPARED;
    list.flags = (elf.is_position_independent() ? std::uint32_t{IPROBE_PL_FLAG_PIE} : 0u) |
                 (elf.is_shared_library() ? std::uint32_t{IPROBE_PL_FLAG_SHARED} : 0u) |
                 (entries.any_line ? std::uint32_t{IPROBE_PL_FLAG_DWARF} : 0u);
    list.module = elf.is_shared_library() && !elf.soname().empty() ? elf.soname() : path;
    list.build_id = elf.build_id();
    list.probes = std::move(entries.probes);
    list.refused = std::move(entries.refused);
    list.normalize();
    return list;
}

void add_relocation_plans(ProbeList& list, const std::string& binary) {
    const bool moved_missing = std::any_of(list.probes.begin(), list.probes.end(),
                                           [](const Probe& p) { return p.relocated && p.moved.empty(); });
    if (list.flow == IPROBE_FLOW_UNPREPARED || !moved_missing) return;
    const elf::ElfFile elf(binary);
    if (elf.build_id() != list.build_id) return;  // another build: its plans would not be this list's
    const std::set<std::uint64_t> unpadded = marked_unpadded(elf);
    RelocatedEntries planned = relocated_entries(elf, &unpadded);
    std::map<std::uint64_t, std::vector<std::uint8_t>*> moved_at;
    for (Probe& p : planned.probes)
        if (p.relocated) moved_at[p.site] = &p.moved;
    for (Probe& p : list.probes)
        if (p.relocated)
            if (auto it = moved_at.find(p.site); it != moved_at.end()) p.moved = std::move(*it->second);
    if (list.refused.empty()) list.refused = std::move(planned.refused);  // (never replaced: it may be pointed to)
}

}  // namespace iprobe::probelist
