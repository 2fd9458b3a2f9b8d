#include "iprobe/elf/function_signature.h"

#include <dwarf.h>
#include <elfutils/libdw.h>

#include <memory>

namespace iprobe::elf {

namespace {

constexpr int kMaxDepth = 24;  // DWARF from a file is input: no cycle may recurse forever

std::string die_name(Dwarf_Die* die) {
    Dwarf_Attribute attr;
    const char* name = dwarf_formstring(dwarf_attr_integrate(die, DW_AT_name, &attr));
    return name ? name : "";
}

bool type_of(Dwarf_Die* die, Dwarf_Die* out) {
    Dwarf_Attribute attr;
    return dwarf_attr_integrate(die, DW_AT_type, &attr) && dwarf_formref_die(&attr, out);
}

std::string type_name(Dwarf_Die* die, int depth);

// A base type by what the ABI sees (encoding and size), spelled as C does:
// gcc says "long int" where clang says "long", and long long is long here.
std::string base_type_name(Dwarf_Die* die, const std::string& name) {
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

// The subprogram whose code starts at `entry`, anywhere under `die`
// (namespaces and classes nest them in C++).
bool find_subprogram(Dwarf_Die* die, std::uint64_t entry, Dwarf_Die* out, int depth) {
    if (depth > kMaxDepth) return false;
    Dwarf_Die child;
    if (dwarf_child(die, &child) != 0) return false;
    do {
        const int tag = dwarf_tag(&child);
        if (tag == DW_TAG_subprogram) {
            Dwarf_Addr low = 0;
            if (dwarf_lowpc(&child, &low) == 0 && low == entry) {
                *out = child;
                return true;
            }
        } else if (tag == DW_TAG_namespace || tag == DW_TAG_structure_type || tag == DW_TAG_class_type ||
                   tag == DW_TAG_lexical_block) {
            if (find_subprogram(&child, entry, out, depth + 1)) return true;
        }
    } while (dwarf_siblingof(&child, &child) == 0);
    return false;
}

struct DwarfCloser {
    void operator()(Dwarf* d) const { dwarf_end(d); }
};

// The DIE of the function whose code starts at `entry`; `dwarf` keeps it valid.
bool find_function(const ElfFile& elf, std::uint64_t entry, std::unique_ptr<Dwarf, DwarfCloser>& dwarf,
                   Dwarf_Die* function) {
    if (!elf.section(".debug_info") && !elf.section(".zdebug_info")) return false;
    dwarf.reset(dwarf_begin_elf(elf.native_handle(), DWARF_C_READ, nullptr));
    if (!dwarf) return false;
    Dwarf_Die unit;
    bool found = dwarf_addrdie(dwarf.get(), entry, &unit) && find_subprogram(&unit, entry, function, 0);
    // No aranges (clang): walk every unit.
    for (Dwarf_Off offset = 0, next = 0; !found;) {
        std::size_t header = 0;
        if (dwarf_nextcu(dwarf.get(), offset, &next, &header, nullptr, nullptr, nullptr) != 0) break;
        found = dwarf_offdie(dwarf.get(), offset + header, &unit) && find_subprogram(&unit, entry, function, 0);
        offset = next;
    }
    return found;
}

// Follows typedefs and qualifiers to the type the ABI sees.
bool strip_type(Dwarf_Die* type, int depth = 0) {
    if (depth > kMaxDepth) return false;
    const int tag = dwarf_tag(type);
    if (tag == DW_TAG_typedef || tag == DW_TAG_const_type || tag == DW_TAG_volatile_type ||
        tag == DW_TAG_restrict_type || tag == DW_TAG_atomic_type) {
        Dwarf_Die next;
        if (!type_of(type, &next)) return false;  // const void
        *type = next;
        return strip_type(type, depth + 1);
    }
    return true;
}

ParameterInfo describe_value(Dwarf_Die* die) {
    ParameterInfo info;
    info.name = die_name(die);
    info.type = referred(die, 0);
    Dwarf_Die type;
    if (!type_of(die, &type) || !strip_type(&type)) return info;
    const int tag = dwarf_tag(&type);
    const int size = dwarf_bytesize(&type);
    Dwarf_Attribute attr;
    Dwarf_Word encoding = 0;
    switch (tag) {
    case DW_TAG_pointer_type:
    case DW_TAG_reference_type:
    case DW_TAG_rvalue_reference_type: {
        info.is_integer = true;
        info.size = 8;
        Dwarf_Die pointee;
        if (tag == DW_TAG_pointer_type && type_of(&type, &pointee) && strip_type(&pointee) &&
            dwarf_tag(&pointee) == DW_TAG_base_type && dwarf_bytesize(&pointee) == 1 &&
            dwarf_attr_integrate(&pointee, DW_AT_encoding, &attr) && dwarf_formudata(&attr, &encoding) == 0)
            info.is_char_pointer = encoding == DW_ATE_signed_char || encoding == DW_ATE_unsigned_char ||
                                   encoding == DW_ATE_signed || encoding == DW_ATE_unsigned;
        break;
    }
    case DW_TAG_enumeration_type: {
        info.is_integer = size > 0 && size <= 8;
        info.size = static_cast<unsigned>(size > 0 ? size : 4);
        Dwarf_Die base;
        info.is_signed = !type_of(&type, &base) ||
                         (dwarf_attr_integrate(&base, DW_AT_encoding, &attr) && dwarf_formudata(&attr, &encoding) == 0 &&
                          (encoding == DW_ATE_signed || encoding == DW_ATE_signed_char));
        break;
    }
    case DW_TAG_base_type:
        if (dwarf_attr_integrate(&type, DW_AT_encoding, &attr) && dwarf_formudata(&attr, &encoding) == 0 && size > 0 &&
            size <= 8 && encoding != DW_ATE_float) {
            info.is_integer = true;
            info.size = static_cast<unsigned>(size);
            info.is_signed = encoding == DW_ATE_signed || encoding == DW_ATE_signed_char;
        } else {
            info.size = static_cast<unsigned>(size > 0 ? size : 0);
        }
        break;
    default: info.size = static_cast<unsigned>(size > 0 ? size : 0); break;
    }
    return info;
}

}  // namespace

std::optional<FunctionParameters> function_parameters(const ElfFile& elf, std::uint64_t entry) {
    std::unique_ptr<Dwarf, DwarfCloser> dwarf;
    Dwarf_Die function;
    if (!find_function(elf, entry, dwarf, &function)) return std::nullopt;
    FunctionParameters out;
    Dwarf_Die type;
    if (type_of(&function, &type)) out.returns = describe_value(&function);
    if (out.returns) out.returns->name.clear();
    // Integer-class values take the next integer register; a struct larger
    // than 16 bytes goes to memory, one of up to 16 takes one or two
    // (whichever class: counted as taking its registers, never read).
    int next = 0;
    Dwarf_Die param;
    if (dwarf_child(&function, &param) == 0) do {
            if (dwarf_tag(&param) != DW_TAG_formal_parameter) continue;
            ParameterInfo p = describe_value(&param);
            if (p.is_integer) {
                p.integer_register = next < 6 ? next : -1;
                next++;
            } else if (p.size > 8 && p.size <= 16 && p.type.rfind("long double", 0) != 0) {
                next += 2;
            } else if (p.size <= 8 && p.type != "float" && p.type != "double" && p.size > 0) {
                next += 1;  // a small struct or union: one register (integer class assumed)
            }
            out.parameters.push_back(std::move(p));
        } while (dwarf_siblingof(&param, &param) == 0);
    return out;
}

std::optional<std::string> function_signature(const ElfFile& elf, std::uint64_t entry) {
    std::unique_ptr<Dwarf, DwarfCloser> dwarf;
    Dwarf_Die function;
    if (!find_function(elf, entry, dwarf, &function)) return std::nullopt;
    std::string out = referred(&function, 0) + "(";
    Dwarf_Die param;
    bool first = true;
    if (dwarf_child(&function, &param) == 0) do {
            const int tag = dwarf_tag(&param);
            if (tag != DW_TAG_formal_parameter && tag != DW_TAG_unspecified_parameters) continue;
            out += first ? "" : ", ";
            out += tag == DW_TAG_unspecified_parameters ? "..." : referred(&param, 0);
            first = false;
        } while (dwarf_siblingof(&param, &param) == 0);
    return out + ")";
}

}  // namespace iprobe::elf
