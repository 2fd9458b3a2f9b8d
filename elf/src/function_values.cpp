#include "iprobe/elf/function_values.h"

#include <filesystem>

#include "dwarf_types.h"

namespace iprobe::elf {

namespace {

// Through typedefs and qualifiers to the type that decides the ABI class.
bool strip(Dwarf_Die* die, Dwarf_Die* out, int depth) {
    *out = *die;
    for (int i = 0; i < kMaxDepth; i++) {
        const int tag = dwarf_tag(out);
        if (tag != DW_TAG_typedef && tag != DW_TAG_const_type && tag != DW_TAG_volatile_type &&
            tag != DW_TAG_restrict_type && tag != DW_TAG_atomic_type)
            return true;
        Dwarf_Die next;
        if (!type_of(out, &next)) return false;  // const void
        *out = next;
    }
    (void)depth;
    return false;
}

std::uint64_t udata(Dwarf_Die* die, int name, std::uint64_t fallback) {
    Dwarf_Attribute attr;
    Dwarf_Word v = 0;
    return dwarf_attr_integrate(die, name, &attr) && dwarf_formudata(&attr, &v) == 0 ? v : fallback;
}

ValueType resolve(Dwarf_Die* die, int depth);

bool is_char(Dwarf_Die* die) {
    Dwarf_Die base;
    if (!strip(die, &base, 0) || dwarf_tag(&base) != DW_TAG_base_type || dwarf_bytesize(&base) != 1) return false;
    const auto encoding = udata(&base, DW_AT_encoding, 0);
    return encoding == DW_ATE_signed_char || encoding == DW_ATE_unsigned_char;
}

void resolve_members(Dwarf_Die* die, ValueType& t, int depth) {
    Dwarf_Die child;
    if (dwarf_child(die, &child) != 0) return;
    do {
        if (dwarf_tag(&child) != DW_TAG_member || dwarf_hasattr(&child, DW_AT_bit_size)) continue;
        Dwarf_Die type;
        if (!type_of(&child, &type)) continue;
        t.members.push_back({die_name(&child), static_cast<std::uint32_t>(udata(&child, DW_AT_data_member_location, 0)),
                             std::make_shared<const ValueType>(resolve(&type, depth + 1))});
    } while (dwarf_siblingof(&child, &child) == 0);
}

ValueType resolve(Dwarf_Die* die, int depth) {
    ValueType t;
    t.name = type_name(die, depth);
    Dwarf_Die base;
    if (depth > kMaxDepth || !strip(die, &base, depth)) return t;
    const int size = dwarf_bytesize(&base);
    t.size = size > 0 ? static_cast<std::uint32_t>(size) : 0;
    switch (dwarf_tag(&base)) {
    case DW_TAG_base_type: {
        const auto encoding = udata(&base, DW_AT_encoding, 0);
        if (encoding == DW_ATE_boolean) t.cls = ValueClass::boolean;
        else if (encoding == DW_ATE_signed || encoding == DW_ATE_signed_char) t.cls = ValueClass::signed_int;
        else if (encoding == DW_ATE_unsigned || encoding == DW_ATE_unsigned_char) t.cls = ValueClass::unsigned_int;
        else if (encoding == DW_ATE_float && (t.size == 4 || t.size == 8)) t.cls = ValueClass::floating;
        break;
    }
    case DW_TAG_enumeration_type: {
        t.cls = ValueClass::enumeration;
        Dwarf_Die child;
        if (dwarf_child(&base, &child) == 0) do {
                Dwarf_Attribute attr;
                Dwarf_Sword v = 0;
                if (dwarf_tag(&child) == DW_TAG_enumerator &&
                    dwarf_formsdata(dwarf_attr(&child, DW_AT_const_value, &attr), &v) == 0)
                    t.enumerators.emplace_back(v, die_name(&child));
            } while (dwarf_siblingof(&child, &child) == 0);
        break;
    }
    case DW_TAG_pointer_type: {
        t.size = 8;
        Dwarf_Die pointee;
        t.cls = type_of(&base, &pointee) && is_char(&pointee) ? ValueClass::string : ValueClass::pointer;
        break;
    }
    case DW_TAG_reference_type:
    case DW_TAG_rvalue_reference_type:
        t.size = 8;
        t.cls = ValueClass::pointer;
        break;
    case DW_TAG_structure_type:
    case DW_TAG_class_type:
        // A C++ class that is not trivially copyable goes by invisible reference.
        if (udata(&base, DW_AT_calling_convention, 0) == DW_CC_pass_by_reference) {
            t.name += "&";
            t.size = 8;
            t.cls = ValueClass::pointer;
            break;
        }
        t.cls = ValueClass::structure;
        resolve_members(&base, t, depth);
        break;
    default: break;
    }
    return t;
}

// SysV x86-64 classes of a value's eightbytes (at most two), or nullopt
// when it goes in memory.  `vector[i]`: eightbyte i is SSE.
struct Leaf {
    std::uint32_t offset, size;
    bool floating;
};

bool leaves(const ValueType& t, std::uint32_t at, std::vector<Leaf>& out, int depth) {
    if (depth > kMaxDepth) return false;
    switch (t.cls) {
    case ValueClass::structure:
        for (const auto& m : t.members)
            if (!leaves(*m.type, at + m.offset, out, depth + 1)) return false;
        return true;
    case ValueClass::floating: out.push_back({at, t.size, true}); return true;
    case ValueClass::other: return false;  // arrays, unions, long double: not classified here
    default: out.push_back({at, t.size ? t.size : 8, false}); return true;
    }
}

std::optional<std::vector<bool>> eightbytes(const ValueType& t) {
    if (t.size == 0 || t.size > 16) return std::nullopt;
    if (t.cls == ValueClass::signed_int || t.cls == ValueClass::unsigned_int)
        return std::vector<bool>(t.size > 8 ? 2 : 1, false);  // __int128: two
    std::vector<Leaf> parts;
    if (!leaves(t, 0, parts, 0)) return std::nullopt;
    std::vector<bool> vector((t.size + 7) / 8, true);
    for (const Leaf& l : parts) {
        if (l.offset / 8 != (l.offset + l.size - 1) / 8 || l.offset / 8 >= vector.size()) return std::nullopt;  // unaligned
        if (!l.floating) vector[l.offset / 8] = false;
    }
    return vector;
}

// Registers for `slot` from the next free ones; none when they do not all fit.
void place(ValueSlot& slot, std::uint8_t& gpr, std::uint8_t& xmm, std::uint8_t gpr_max, std::uint8_t xmm_max) {
    const auto classes = eightbytes(slot.type);
    if (!classes) return;
    std::uint8_t need_g = 0, need_x = 0;
    for (bool v : *classes) (v ? need_x : need_g)++;
    if (gpr + need_g > gpr_max || xmm + need_x > xmm_max) return;
    for (bool v : *classes) slot.parts.push_back({v, v ? xmm++ : gpr++});
}

}  // namespace

std::optional<FunctionValues> function_values(const ElfFile& elf, std::uint64_t entry, const std::string& symbol) {
    if (!elf.section(".debug_info") && !elf.section(".zdebug_info")) return std::nullopt;
    std::unique_ptr<Dwarf, DwarfCloser> dwarf(dwarf_begin_elf(elf.native_handle(), DWARF_C_READ, nullptr));
    if (!dwarf) return std::nullopt;
    Dwarf_Die function;
    if (!find_function(dwarf.get(), entry, &function)) return std::nullopt;
    FunctionValues out;
    out.typed = true;
    std::uint8_t gpr = 0, xmm = 0;
    Dwarf_Die ret_type;
    if (type_of(&function, &ret_type)) {
        ValueSlot r;
        r.type = resolve(&ret_type, 0);
        std::uint8_t rg = 0, rx = 0;
        place(r, rg, rx, 2, 2);
        if (r.parts.empty()) gpr = 1;  // in memory: rdi is the hidden pointer to it
        out.ret = std::move(r);
    }
    const bool clone = symbol.find('.') != std::string::npos;
    Dwarf_Die param;
    if (dwarf_child(&function, &param) == 0) do {
            if (dwarf_tag(&param) != DW_TAG_formal_parameter) continue;
            ValueSlot p;
            p.name = die_name(&param);
            Dwarf_Die type;
            if (type_of(&param, &type)) p.type = resolve(&type, 0);
            Dwarf_Attribute attr;
            Dwarf_Sword constant = 0;
            if (clone && !dwarf_hasattr(&param, DW_AT_location)) {
                // dropped by the clone: no register; a propagated constant is still known
                if (dwarf_formsdata(dwarf_attr(&param, DW_AT_const_value, &attr), &constant) == 0) p.constant = constant;
                else continue;
            } else {
                place(p, gpr, xmm, 6, 8);
                if (p.type.cls == ValueClass::string && p.parts.size() == 1) out.strings |= 1u << p.parts[0].reg;
            }
            if (p.name.empty()) p.name = "arg" + std::to_string(out.params.size());
            out.params.push_back(std::move(p));
        } while (dwarf_siblingof(&param, &param) == 0);
    out.gprs = gpr;
    out.xmms = xmm;
    return out;
}

FunctionValues raw_function_values() {
    FunctionValues out;
    for (std::uint8_t i = 0; i < 6; i++) {
        ValueSlot p;
        p.name = "arg" + std::to_string(i);
        p.type = {"uint64_t", ValueClass::unsigned_int, 8, {}, {}};
        p.parts.push_back({false, i});
        out.params.push_back(std::move(p));
    }
    ValueSlot r;
    r.type = {"uint64_t", ValueClass::unsigned_int, 8, {}, {}};
    r.parts.push_back({false, 0});
    out.ret = std::move(r);
    out.gprs = 6;
    return out;
}

std::optional<std::string> debug_file_for(const ElfFile& module) {
    if (module.section(".debug_info") || module.section(".zdebug_info")) return module.path();
    const std::string id = module.build_id_hex();
    if (id.size() < 3) return std::nullopt;
    const std::string path = "/usr/lib/debug/.build-id/" + id.substr(0, 2) + "/" + id.substr(2) + ".debug";
    std::error_code ec;
    if (std::filesystem::is_regular_file(path, ec)) return path;
    return std::nullopt;
}

}  // namespace iprobe::elf
