#include "iprobe/elf/function_values.h"

#include <cstdlib>
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

// ---- where the parameters are at a site inside the function ----

struct Cfa {
    std::uint8_t reg;
    std::int64_t offset;  // the CFA is reg + offset
};

struct CfiCloser {
    void operator()(Dwarf_CFI* c) const { dwarf_cfi_end(c); }
};

constexpr std::uint8_t kRdi = 5, kRbp = 6, kRsp = 7, kLastXmm = 32, kReturnColumn = 16;

bool fits16(std::int64_t v) { return v >= INT16_MIN && v <= INT16_MAX; }

std::optional<std::pair<std::uint8_t, std::int64_t>> breg(const Dwarf_Op& op) {
    if (op.atom >= DW_OP_breg0 && op.atom <= DW_OP_breg31)
        return std::make_pair(static_cast<std::uint8_t>(op.atom - DW_OP_breg0), static_cast<std::int64_t>(op.number));
    if (op.atom == DW_OP_bregx && op.number <= kLastXmm)
        return std::make_pair(static_cast<std::uint8_t>(op.number), static_cast<std::int64_t>(op.number2));
    return std::nullopt;
}

std::optional<Cfa> cfa_at(Dwarf_CFI* cfi, std::uint64_t pc) {
    Dwarf_Frame* frame = nullptr;
    if (!cfi || dwarf_cfi_addrframe(cfi, pc, &frame) != 0) return std::nullopt;
    std::optional<Cfa> out;
    Dwarf_Op* ops = nullptr;
    std::size_t n = 0;
    if (dwarf_frame_cfa(frame, &ops, &n) == 0 && n == 1)
        if (const auto r = breg(ops[0]); r && (r->first == kRsp || r->first == kRbp)) out = Cfa{r->first, r->second};
    std::free(frame);
    return out;
}

// A location expression without pieces, as a recipe; nullopt when the
// runtime cannot follow it (DW_OP_entry_value, a computation, memory not in
// the frame).  A memory location's size is the caller's.
std::optional<SiteLocation> recipe(const Dwarf_Op* ops, std::size_t n, const std::optional<Cfa>& cfa, bool fbreg_is_cfa) {
    using K = SiteLocation::Kind;
    auto memory = [](std::uint8_t reg, std::int64_t offset) -> std::optional<SiteLocation> {
        if (!fits16(offset)) return std::nullopt;
        return SiteLocation{K::memory, reg, 8, offset};
    };
    auto readable = [](std::uint8_t reg) { return reg <= kLastXmm && reg != kRdi && reg != kRsp && reg != kReturnColumn; };
    if (n == 1) {
        const Dwarf_Op& op = ops[0];
        if (op.atom >= DW_OP_reg0 && op.atom <= DW_OP_reg31) {
            const auto reg = static_cast<std::uint8_t>(op.atom - DW_OP_reg0);
            return readable(reg) ? std::optional(SiteLocation{K::reg, reg, 8, 0}) : std::nullopt;
        }
        if (op.atom == DW_OP_regx)
            return op.number <= kLastXmm && readable(static_cast<std::uint8_t>(op.number))
                       ? std::optional(SiteLocation{K::reg, static_cast<std::uint8_t>(op.number), 8, 0})
                       : std::nullopt;
        if (const auto r = breg(op)) {
            // memory in the function's frame only: at rsp, or at rbp where it carries the CFA
            if (r->first == kRsp || (r->first == kRbp && cfa && cfa->reg == kRbp)) return memory(r->first, r->second);
            return std::nullopt;
        }
        if (op.atom == DW_OP_fbreg && fbreg_is_cfa && cfa)
            return memory(cfa->reg, cfa->offset + static_cast<std::int64_t>(op.number));
        if (op.atom == DW_OP_call_frame_cfa && cfa) return memory(cfa->reg, cfa->offset);
        return std::nullopt;
    }
    if (n == 2 && ops[1].atom == DW_OP_stack_value) {
        const Dwarf_Op& op = ops[0];
        if (const auto r = breg(op); r && r->first < kReturnColumn && r->first != kRdi && fits16(r->second))
            return SiteLocation{K::value, r->first, 8, r->second};
        if (op.atom == DW_OP_call_frame_cfa && cfa) return SiteLocation{K::value, cfa->reg, 8, cfa->offset};
        std::int64_t v = 0;
        if (op.atom >= DW_OP_lit0 && op.atom <= DW_OP_lit31) v = op.atom - DW_OP_lit0;
        else if (op.atom == DW_OP_const1u || op.atom == DW_OP_const2u || op.atom == DW_OP_const4u ||
                 op.atom == DW_OP_const8u || op.atom == DW_OP_constu)
            v = static_cast<std::int64_t>(op.number);
        else if (op.atom == DW_OP_const1s || op.atom == DW_OP_const2s || op.atom == DW_OP_const4s ||
                 op.atom == DW_OP_const8s || op.atom == DW_OP_consts)
            v = static_cast<std::int64_t>(op.number);
        else
            return std::nullopt;
        if (!fits16(v)) return std::nullopt;
        return SiteLocation{K::constant, 0, 8, v};
    }
    return std::nullopt;
}

std::uint8_t read_size(std::uint32_t bytes) { return bytes <= 1 ? 1 : bytes <= 2 ? 2 : bytes <= 4 ? 4 : 8; }

// One recipe per part of `p` at `pc`; empty when any part cannot be had.
std::vector<SiteLocation> locate(Dwarf_Die* param, const ValueSlot& p, std::uint64_t pc, const std::optional<Cfa>& cfa,
                                 bool fbreg_is_cfa) {
    Dwarf_Attribute attr;
    if (p.parts.empty()) return {};
    if (!dwarf_attr_integrate(param, DW_AT_location, &attr)) {
        // An inlined copy's argument the caller passed as a constant.
        Dwarf_Sword v = 0;
        if (p.parts.size() == 1 && dwarf_formsdata(dwarf_attr_integrate(param, DW_AT_const_value, &attr), &v) == 0 &&
            fits16(v))
            return {SiteLocation{SiteLocation::Kind::constant, 0, 8, v}};
        return {};
    }
    Dwarf_Op* expr = nullptr;
    std::size_t len = 0;
    if (dwarf_getlocation_addr(&attr, pc, &expr, &len, 1) != 1 || len == 0) return {};
    const std::uint32_t size = p.type.size ? p.type.size : 8;
    auto part_size = [&](std::size_t i) { return read_size(size > 8 * i ? size - 8 * static_cast<std::uint32_t>(i) : 8); };
    std::vector<SiteLocation> out;
    // Pieces: one per eightbyte, each followed by DW_OP_piece 8 (the last may be shorter).
    std::vector<std::pair<std::size_t, std::size_t>> pieces;  // [begin, end) of each piece's ops
    std::size_t begin = 0;
    for (std::size_t i = 0; i < len; i++)
        if (expr[i].atom == DW_OP_piece) {
            pieces.emplace_back(begin, i);
            if (expr[i].number != 8 && !(pieces.size() == p.parts.size() && 8 * (pieces.size() - 1) + expr[i].number >= size))
                return {};
            begin = i + 1;
        } else if (expr[i].atom == DW_OP_bit_piece) {
            return {};
        }
    if (!pieces.empty()) {
        if (begin != len || pieces.size() != p.parts.size()) return {};
        for (std::size_t i = 0; i < pieces.size(); i++) {
            auto r = recipe(expr + pieces[i].first, pieces[i].second - pieces[i].first, cfa, fbreg_is_cfa);
            if (!r) return {};
            if (r->kind == SiteLocation::Kind::memory) r->size = part_size(i);
            out.push_back(*r);
        }
        return out;
    }
    auto whole = recipe(expr, len, cfa, fbreg_is_cfa);
    if (!whole) return {};
    if (whole->kind == SiteLocation::Kind::memory) {
        for (std::size_t i = 0; i < p.parts.size(); i++) {
            SiteLocation at = *whole;
            at.offset += static_cast<std::int64_t>(8 * i);
            at.size = part_size(i);
            if (!fits16(at.offset)) return {};
            out.push_back(at);
        }
        return out;
    }
    if (p.parts.size() != 1) return {};  // a register holds at most one eightbyte
    return {*whole};
}

// The CFA at the site: from the module's .eh_frame, else from `dwarf`'s
// .debug_frame (null: none).
std::optional<Cfa> site_cfa(const Site& site, Dwarf* dwarf) {
    std::unique_ptr<Dwarf_CFI, CfiCloser> eh(site.cfi_file ? dwarf_getcfi_elf(site.cfi_file->native_handle()) : nullptr);
    std::optional<Cfa> cfa = cfa_at(eh.get(), site.pc);
    if (!cfa && dwarf) cfa = cfa_at(dwarf_getcfi(dwarf), site.pc);  // .debug_frame: owned by `dwarf`
    return cfa;
}

std::optional<SiteLocation> slot_of(const std::optional<Cfa>& cfa) {
    if (!cfa || !fits16(cfa->offset - 8)) return std::nullopt;
    return SiteLocation{SiteLocation::Kind::value, cfa->reg, 8, cfa->offset - 8};
}

// ---- an inlined copy: a DW_TAG_inlined_subroutine in another function ----

// The abstract instance a DIE stands for: its DW_AT_abstract_origin, else itself.
Dwarf_Off origin_of(Dwarf_Die* die) {
    Dwarf_Attribute attr;
    Dwarf_Die origin;
    if (dwarf_attr(die, DW_AT_abstract_origin, &attr) && dwarf_formref_die(&attr, &origin)) return dwarf_dieoffset(&origin);
    return dwarf_dieoffset(die);
}

// Down from `scope` through the blocks and inlined copies holding `pc`: the
// innermost copy of the abstract function `origin`.
bool copy_at(Dwarf_Die* scope, std::uint64_t pc, Dwarf_Off origin, Dwarf_Die* out) {
    bool found = false;
    Dwarf_Die at = *scope;
    for (int depth = 0; depth < kMaxDepth; depth++) {
        Dwarf_Die child;
        bool deeper = false;
        if (dwarf_child(&at, &child) == 0) do {
                const int tag = dwarf_tag(&child);
                if ((tag == DW_TAG_inlined_subroutine || tag == DW_TAG_lexical_block) && dwarf_haspc(&child, pc) == 1) {
                    if (tag == DW_TAG_inlined_subroutine && origin_of(&child) == origin) *out = child, found = true;
                    at = child;
                    deeper = true;
                    break;
                }
            } while (dwarf_siblingof(&child, &child) == 0);
        if (!deeper) break;
    }
    return found;
}

// The code of every copy of `origin` inlined under `scope` (not beneath one: its own are its).
void copies_under(Dwarf_Die* scope, Dwarf_Off origin, std::vector<std::pair<std::uint64_t, std::uint64_t>>& out,
                  int depth) {
    Dwarf_Die child;
    if (depth > kMaxDepth || dwarf_child(scope, &child) != 0) return;
    do {
        const int tag = dwarf_tag(&child);
        if (tag == DW_TAG_inlined_subroutine && origin_of(&child) == origin) {
            Dwarf_Addr base = 0, low = 0, high = 0;
            for (std::ptrdiff_t at = 0; (at = dwarf_ranges(&child, at, &base, &low, &high)) > 0;) out.emplace_back(low, high);
        } else if (tag == DW_TAG_inlined_subroutine || tag == DW_TAG_lexical_block) {
            copies_under(&child, origin, out, depth + 1);
        }
    } while (dwarf_siblingof(&child, &child) == 0);
}

// The copy's parameter standing for the function's `param` (both refer to
// one abstract parameter); false when the copy has none (optimized away).
bool copy_param(Dwarf_Die* copy, Dwarf_Die* param, Dwarf_Die* out) {
    const Dwarf_Off want = origin_of(param);
    Dwarf_Die child;
    if (dwarf_child(copy, &child) != 0) return false;
    do {
        if (dwarf_tag(&child) == DW_TAG_formal_parameter && origin_of(&child) == want) {
            *out = child;
            return true;
        }
    } while (dwarf_siblingof(&child, &child) == 0);
    return false;
}

}  // namespace

std::optional<SiteLocation> return_slot_at(const Site& site, const ElfFile* dwarf_file) {
    const FunctionDies* dies = dwarf_file ? dwarf_file->function_dies() : nullptr;
    return slot_of(site_cfa(site, dies ? dies->dwarf() : nullptr));
}

std::optional<FunctionValues> function_values(const ElfFile& elf, std::uint64_t entry, const std::string& symbol,
                                              const std::optional<Site>& site) {
    const FunctionDies* dies = elf.function_dies();
    Dwarf_Die function;
    if (!dies || !dies->find(entry, &function)) return std::nullopt;
    Dwarf* dwarf = dies->dwarf();
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
    std::optional<Cfa> cfa;
    bool fbreg_is_cfa = false;
    Dwarf_Die host, copy;  // an inlined copy's: the function it is in, and its DW_TAG_inlined_subroutine
    if (site) {
        Dwarf_Addr base = 0, low = 0, high = 0;
        for (std::ptrdiff_t at = 0; (at = dwarf_ranges(&function, at, &base, &low, &high)) > 0;)
            out.code.emplace_back(low, high);
        // Outside its own code: an inlined copy's hook, in its host's code
        // and frame; its parameters are the copy's, its return is none.
        Dwarf_Die* frame_of = &function;
        copies_under(&function, origin_of(&function), out.own_copies, 0);
        if (!out.holds(site->pc)) {
            Dwarf_Die unit;
            if (!dwarf_addrdie(dwarf, site->pc, &unit) || !dies->host_at(dwarf_dieoffset(&unit), site->pc, &host) ||
                !copy_at(&host, site->pc, origin_of(&function), &copy))
                return std::nullopt;
            out.inlined = true;
            frame_of = &host;
            out.code.clear();
            out.own_copies.clear();
            Dwarf_Addr base = 0, low = 0, high = 0;
            for (std::ptrdiff_t at = 0; (at = dwarf_ranges(&copy, at, &base, &low, &high)) > 0;)
                out.code.emplace_back(low, high);
            copies_under(&copy, origin_of(&function), out.own_copies, 0);
        }
        out.at_site = true;
        cfa = site_cfa(*site, dwarf);
        out.return_slot = slot_of(cfa);
        Dwarf_Attribute attr;
        Dwarf_Op* ops = nullptr;
        std::size_t n = 0;
        fbreg_is_cfa = dwarf_attr_integrate(frame_of, DW_AT_frame_base, &attr) && dwarf_getlocation(&attr, &ops, &n) == 0 &&
                       n == 1 && ops[0].atom == DW_OP_call_frame_cfa;
    }
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
                Dwarf_Die in_copy;
                if (site && !out.inlined) p.at_site = locate(&param, p, site->pc, cfa, fbreg_is_cfa);
                else if (site && copy_param(&copy, &param, &in_copy))
                    p.at_site = locate(&in_copy, p, site->pc, cfa, fbreg_is_cfa);
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
