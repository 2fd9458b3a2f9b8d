#include "dwarf_types.h"

#include <algorithm>
#include <cstddef>
#include <iterator>

namespace iprobe::elf {



std::string die_name(Dwarf_Die* die) {
    Dwarf_Attribute attr;
    const char* name = dwarf_formstring(dwarf_attr_integrate(die, DW_AT_name, &attr));
    return name ? name : "";
}

bool type_of(Dwarf_Die* die, Dwarf_Die* out) {
    Dwarf_Attribute attr;
    return dwarf_attr_integrate(die, DW_AT_type, &attr) && dwarf_formref_die(&attr, out);
}


// A base type by what the ABI sees (encoding and size), spelled as C does:
// gcc says "long int" where clang says "long", and long long is long here.
static std::string base_type_name(Dwarf_Die* die, const std::string& name) {
    Dwarf_Attribute attr;
    Dwarf_Word encoding = 0;
    if (!dwarf_attr_integrate(die, DW_AT_encoding, &attr) || dwarf_formudata(&attr, &encoding) != 0) return name;
    const int size = dwarf_bytesize(die);
    const bool is_signed = encoding == DW_ATE_signed || encoding == DW_ATE_signed_char;
    const bool is_unsigned = encoding == DW_ATE_unsigned || encoding == DW_ATE_unsigned_char;
    if (encoding == DW_ATE_boolean) return "bool";
    if (encoding == DW_ATE_signed_char && size == 1) return "char";
    if (is_signed || is_unsigned) {
        const char* names[] = {"?", "char", "short", "?", "int", "?", "?", "?", "long"};
        const std::string base = size == 16 ? "__int128" : size > 0 && size <= 8 ? names[size] : name;
        return (is_unsigned ? "unsigned " : size == 1 ? "signed " : "") + base;
    }
    if (encoding == DW_ATE_float) return size == 4 ? "float" : size == 8 ? "double" : size == 16 ? "long double" : name;
    return name;
}

// The type `die` refers to by DW_AT_type, or "void" when it names none.
std::string referred(Dwarf_Die* die, int depth) {
    Dwarf_Die type;
    return type_of(die, &type) ? type_name(&type, depth + 1) : "void";
}

std::string type_name(Dwarf_Die* die, int depth) {
    if (depth > kMaxDepth) return "?";
    const std::string name = die_name(die);
    switch (dwarf_tag(die)) {
    case DW_TAG_base_type: return base_type_name(die, name);
    case DW_TAG_typedef: return referred(die, depth);
    case DW_TAG_pointer_type: return referred(die, depth) + "*";
    case DW_TAG_reference_type: return referred(die, depth) + "&";
    case DW_TAG_rvalue_reference_type: return referred(die, depth) + "&&";
    case DW_TAG_const_type: return "const " + referred(die, depth);
    case DW_TAG_volatile_type: return "volatile " + referred(die, depth);
    case DW_TAG_restrict_type: return referred(die, depth);
    case DW_TAG_atomic_type: return "_Atomic " + referred(die, depth);
    case DW_TAG_array_type: return referred(die, depth) + "[]";
    case DW_TAG_structure_type: return "struct " + (name.empty() ? "<anonymous>" : name);
    case DW_TAG_class_type: return "class " + (name.empty() ? "<anonymous>" : name);
    case DW_TAG_union_type: return "union " + (name.empty() ? "<anonymous>" : name);
    case DW_TAG_enumeration_type: return "enum " + (name.empty() ? "<anonymous>" : name);
    case DW_TAG_subroutine_type: return "function returning " + referred(die, depth);
    case DW_TAG_unspecified_type: return name;  // decltype(nullptr)
    default: return "<tag " + std::to_string(dwarf_tag(die)) + ">";
    }
}

FunctionDies::FunctionDies(Elf* elf) : dwarf_(dwarf_begin_elf(elf, DWARF_C_READ, nullptr)) {
    if (!dwarf_) return;
    for (Dwarf_Off offset = 0, next = 0;; offset = next) {
        std::size_t header = 0;
        if (dwarf_nextcu(dwarf_.get(), offset, &next, &header, nullptr, nullptr, nullptr) != 0) break;
        Dwarf_Die unit;
        if (!dwarf_offdie(dwarf_.get(), offset + header, &unit)) continue;
        index(&unit, offset + header, 0, false);
    }
    std::stable_sort(starts_.begin(), starts_.end(), [](const Start& a, const Start& b) { return a.entry < b.entry; });
    std::stable_sort(ranges_.begin(), ranges_.end(), [](const Range& a, const Range& b) { return a.low < b.low; });
}

// Every subprogram under `parent`, by where each of its ranges starts.
void FunctionDies::index(Dwarf_Die* parent, Dwarf_Off unit, int depth, bool in_block) {
    if (depth > kMaxDepth) return;
    Dwarf_Die child;
    if (dwarf_child(parent, &child) != 0) return;
    do {
        const int tag = dwarf_tag(&child);
        if (tag == DW_TAG_subprogram) {
            Dwarf_Addr low = 0, base = 0, start = 0, end = 0;
            const bool has_low = dwarf_lowpc(&child, &low) == 0;
            if (has_low) starts_.push_back({low, unit, child});
            const std::size_t order = subprograms_++;
            for (std::ptrdiff_t at = 0; (at = dwarf_ranges(&child, at, &base, &start, &end)) > 0;) {
                if (!has_low || start != low) starts_.push_back({start, unit, child});
                if (!in_block && end > start) {
                    ranges_.push_back({start, end, unit, order, child});
                    widest_ = std::max<std::uint64_t>(widest_, end - start);
                }
            }
        } else if (tag == DW_TAG_namespace || tag == DW_TAG_structure_type || tag == DW_TAG_class_type ||
                   tag == DW_TAG_lexical_block) {
            index(&child, unit, depth + 1, in_block || tag == DW_TAG_lexical_block);
        }
    } while (dwarf_siblingof(&child, &child) == 0);
}

bool FunctionDies::host_at(Dwarf_Off unit, std::uint64_t pc, Dwarf_Die* host) const {
    // the ranges starting in (pc - widest_, pc]: the only ones that can hold pc
    auto it = std::upper_bound(ranges_.begin(), ranges_.end(), pc, [](std::uint64_t v, const Range& r) { return v < r.low; });
    const Range* first = nullptr;
    while (it != ranges_.begin()) {
        --it;
        if (pc - it->low >= widest_) break;
        if (pc < it->high && it->unit == unit && (!first || it->order < first->order)) first = &*it;
    }
    if (!first) return false;
    *host = first->die;
    return true;
}

bool FunctionDies::find(std::uint64_t entry, Dwarf_Die* function) const {
    const auto [first, last] = std::equal_range(starts_.begin(), starts_.end(), Start{entry, 0, {}},
                                                [](const Start& a, const Start& b) { return a.entry < b.entry; });
    if (first == last) return false;
    auto chosen = first;
    Dwarf_Die unit;
    if (std::next(first) != last && dwarf_addrdie(dwarf_.get(), entry, &unit)) {
        const Dwarf_Off at = dwarf_dieoffset(&unit);
        const auto in_unit = std::find_if(first, last, [at](const Start& s) { return s.unit == at; });
        if (in_unit != last) chosen = in_unit;
    }
    *function = chosen->die;
    return true;
}

}  // namespace iprobe::elf
