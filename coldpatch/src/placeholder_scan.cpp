// Finding the hook calls: a linear sweep over each executable section with
// Capstone, call targets resolved through the PLT/GOT relocations (or to a
// local definition of the hook in static links), never by byte patterns.
#include <capstone/capstone.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <optional>
#include <set>

#include "iprobe/coldpatch/coldpatch.h"
#include "iprobe/elf/demangle.h"
#include "iprobe/support/error.h"
#include "landing_pads.h"
#include "iprobe/elf/source_lines.h"

namespace iprobe::coldpatch {

namespace {

// General-purpose registers by number (rax=0 .. r15=15), any width.
int gp_index(x86_reg reg) {
    switch (reg) {
        case X86_REG_RAX: case X86_REG_EAX: case X86_REG_AX: case X86_REG_AL: case X86_REG_AH: return 0;
        case X86_REG_RCX: case X86_REG_ECX: case X86_REG_CX: case X86_REG_CL: case X86_REG_CH: return 1;
        case X86_REG_RDX: case X86_REG_EDX: case X86_REG_DX: case X86_REG_DL: case X86_REG_DH: return 2;
        case X86_REG_RBX: case X86_REG_EBX: case X86_REG_BX: case X86_REG_BL: case X86_REG_BH: return 3;
        case X86_REG_RSP: case X86_REG_ESP: case X86_REG_SP: case X86_REG_SPL: return 4;
        case X86_REG_RBP: case X86_REG_EBP: case X86_REG_BP: case X86_REG_BPL: return 5;
        case X86_REG_RSI: case X86_REG_ESI: case X86_REG_SI: case X86_REG_SIL: return 6;
        case X86_REG_RDI: case X86_REG_EDI: case X86_REG_DI: case X86_REG_DIL: return 7;
        case X86_REG_R8: case X86_REG_R8D: case X86_REG_R8W: case X86_REG_R8B: return 8;
        case X86_REG_R9: case X86_REG_R9D: case X86_REG_R9W: case X86_REG_R9B: return 9;
        case X86_REG_R10: case X86_REG_R10D: case X86_REG_R10W: case X86_REG_R10B: return 10;
        case X86_REG_R11: case X86_REG_R11D: case X86_REG_R11W: case X86_REG_R11B: return 11;
        case X86_REG_R12: case X86_REG_R12D: case X86_REG_R12W: case X86_REG_R12B: return 12;
        case X86_REG_R13: case X86_REG_R13D: case X86_REG_R13W: case X86_REG_R13B: return 13;
        case X86_REG_R14: case X86_REG_R14D: case X86_REG_R14W: case X86_REG_R14B: return 14;
        case X86_REG_R15: case X86_REG_R15D: case X86_REG_R15W: case X86_REG_R15B: return 15;
        default: return -1;
    }
}

constexpr int kRdi = 7;
// Registers a call may clobber (SysV x86-64): rax rcx rdx rsi rdi r8-r11.
constexpr std::uint16_t kCallClobbered = 0x0fc7;

// What one instruction does to the general-purpose registers, as far as
// tracing a constant into %rdi needs to know.
struct RegEffect {
    enum Op : std::uint8_t { other, load_constant, copy_register, call } op = other;
    std::int8_t dst = -1;
    std::int8_t src = -1;
    bool falls_through = true;  // false after jmp, ret, ud2
    enum Cond : std::uint8_t { no_cond, jump_if_equal, jump_if_not_equal, jump_if_above } cond = no_cond;
    bool is_nop = false;           // padding between blocks
    bool compares_immediate = false;  // `cmp $imm, reg`
    std::int64_t immediate = 0;
    std::int8_t compared[2] = {-1, -1};  // `cmp reg, reg`: both registers
    std::uint16_t written = 0;  // bit per gp_index
    std::uint64_t constant = 0;
    std::uint64_t address = 0;
};

// What a register holds on the paths reaching an instruction.
struct Reaching {
    // none: no path seen (yet); orphan: only code no branch is known to
    // reach (padding, a jump-table case), which real paths override.
    enum State : std::uint8_t { none, unknown, known, orphan } state = none;
    std::uint64_t value = 0;

    static Reaching of(std::uint64_t v) { return {known, v}; }
    static Reaching not_known() { return {unknown, 0}; }
    Reaching merged(const Reaching& other) const {
        if (other.state == none) return *this;
        if (state == none) return other;
        if (state == orphan) return other;
        if (other.state == orphan) return *this;
        if (state == known && other.state == known && value == other.value) return *this;
        return not_known();
    }
};

struct HookTargets {
    // Addresses a direct call may go to (PLT entries, local definitions)
    // and GOT slots an indirect call may go through, per hook.
    std::vector<std::uint64_t> enter_calls, exit_calls, enter_slots, exit_slots;
};

enum class Hook { none, enter, exit };

Hook hook_named(std::string_view name) {
    if (name == kEnterHook) return Hook::enter;
    if (name == kExitHook) return Hook::exit;
    return Hook::none;
}

bool holds(const std::vector<std::uint64_t>& v, std::uint64_t a) {
    return std::find(v.begin(), v.end(), a) != v.end();
}

HookTargets find_hook_targets(const elf::ElfFile& elf, probelist::ProbeList& list) {
    HookTargets t;
    for (const auto& e : elf.plt_entries()) {
        const Hook h = hook_named(e.symbol);
        if (h == Hook::enter) t.enter_calls.push_back(e.address);
        if (h == Hook::exit) t.exit_calls.push_back(e.address);
        if (h == Hook::enter && !list.enter_target) list.enter_target = e.address, list.enter_got_slot = e.got_slot;
        if (h == Hook::exit && !list.exit_target) list.exit_target = e.address, list.exit_got_slot = e.got_slot;
    }
    for (const auto& s : elf.got_slots()) {
        const Hook h = hook_named(s.symbol);
        if (h == Hook::enter) t.enter_slots.push_back(s.address);
        if (h == Hook::exit) t.exit_slots.push_back(s.address);
        if (h == Hook::enter && !list.enter_got_slot) list.enter_got_slot = s.address;
        if (h == Hook::exit && !list.exit_got_slot) list.exit_got_slot = s.address;
    }
    // Static links (and programs defining the hooks themselves) call a local
    // definition directly.
    for (const auto& sym : elf.symbols()) {
        if (!sym.defined() || !sym.is_function()) continue;
        const Hook h = hook_named(sym.name);
        if (h == Hook::enter && !holds(t.enter_calls, sym.address)) {
            t.enter_calls.push_back(sym.address);
            if (!list.enter_target) list.enter_target = sym.address;
        }
        if (h == Hook::exit && !holds(t.exit_calls, sym.address)) {
            t.exit_calls.push_back(sym.address);
            if (!list.exit_target) list.exit_target = sym.address;
        }
    }
    return t;
}

class Scanner {
public:
    Scanner(const elf::ElfFile& elf, const HookTargets& targets)
        : elf_(elf), targets_(targets), landing_edges_(landing_edges(elf)) {
        if (cs_open(CS_ARCH_X86, CS_MODE_64, &cs_) != CS_ERR_OK)
            throw Error("capstone: cannot open an x86-64 disassembler", ExitCode::unavailable);
        cs_option(cs_, CS_OPT_DETAIL, CS_OPT_ON);
        insn_ = cs_malloc(cs_);
    }
    ~Scanner() {
        cs_free(insn_, 1);
        cs_close(&cs_);
    }
    Scanner(const Scanner&) = delete;
    Scanner& operator=(const Scanner&) = delete;

    // Probes whose call target is both hooks (static glibc defines
    // __cyg_profile_func_exit as an alias of _enter): indexes into `out`.
    std::vector<std::size_t> aliased;

    void scan_section(const elf::ElfSection& section, std::vector<probelist::Probe>& out, std::size_t& tail_jumps) {
        const auto code = elf_.section_bytes(section);
        const std::uint8_t* p = code.data();
        std::size_t left = code.size();
        std::uint64_t address = section.address;
        history_.clear();
        branches_.clear();
        std::vector<PendingSite> pending;
        while (left > 0) {
            if (!cs_disasm_iter(cs_, &p, &left, &address, insn_)) {
                RegEffect undecodable;  // data or padding in code: resynchronise
                undecodable.address = address;
                undecodable.written = 0xffff;
                history_.push_back(undecodable);
                ++p, --left, ++address;
                continue;
            }
            record_branch(*insn_);
            history_.push_back(effect_of(*insn_));
            record_jump_table(*insn_, section);
            const auto [hook, form] = hook_called(*insn_);
            if (hook == Hook::none) continue;
            if (is_jump(*insn_)) {
                ++tail_jumps;
                continue;
            }
            PendingSite site{history_.size() - 1, hook, form, is_aliased(*insn_),
                             static_cast<std::uint8_t>(insn_->size), {}};
            std::copy(insn_->bytes, insn_->bytes + insn_->size, site.bytes.begin());
            pending.push_back(site);
        }
        add_landing_edges(section);
        std::sort(branches_.begin(), branches_.end());
        for (const auto& site : pending) {
            if (site.aliased) aliased.push_back(out.size());
            out.push_back(make_probe(site));
        }
    }

private:
    static bool is_jump(const cs_insn& insn) { return insn.id == X86_INS_JMP; }

    bool is_aliased(const cs_insn& insn) const {
        const cs_x86_op& op = insn.detail->x86.operands[0];
        if (op.type == X86_OP_IMM)
            return holds(targets_.enter_calls, std::uint64_t(op.imm)) && holds(targets_.exit_calls, std::uint64_t(op.imm));
        const std::uint64_t slot = insn.address + insn.size + op.mem.disp;
        return holds(targets_.enter_slots, slot) && holds(targets_.exit_slots, slot);
    }

    std::pair<Hook, probelist::SiteForm> hook_called(const cs_insn& insn) const {
        if (insn.id != X86_INS_CALL && insn.id != X86_INS_JMP) return {Hook::none, probelist::SiteForm::call_rel32};
        const cs_x86& x86 = insn.detail->x86;
        if (x86.op_count != 1) return {Hook::none, probelist::SiteForm::call_rel32};
        const cs_x86_op& op = x86.operands[0];
        if (op.type == X86_OP_IMM && insn.size == 5 && insn.bytes[0] == (insn.id == X86_INS_CALL ? 0xe8 : 0xe9)) {
            const auto target = static_cast<std::uint64_t>(op.imm);
            if (holds(targets_.enter_calls, target)) return {Hook::enter, probelist::SiteForm::call_rel32};
            if (holds(targets_.exit_calls, target)) return {Hook::exit, probelist::SiteForm::call_rel32};
        }
        if (op.type == X86_OP_MEM && op.mem.base == X86_REG_RIP && op.mem.index == X86_REG_INVALID &&
            insn.size == 6 && insn.bytes[0] == 0xff) {
            const std::uint64_t slot = insn.address + insn.size + op.mem.disp;
            if (holds(targets_.enter_slots, slot)) return {Hook::enter, probelist::SiteForm::call_rip_indirect};
            if (holds(targets_.exit_slots, slot)) return {Hook::exit, probelist::SiteForm::call_rip_indirect};
        }
        return {Hook::none, probelist::SiteForm::call_rel32};
    }

    RegEffect effect_of(const cs_insn& insn) const {
        RegEffect e;
        e.address = insn.address;
        e.falls_through = !(insn.id == X86_INS_JMP || insn.id == X86_INS_LJMP || insn.id == X86_INS_RET ||
                            insn.id == X86_INS_UD2);
        e.is_nop = insn.id == X86_INS_NOP || insn.id == X86_INS_INT3;
        if (insn.id == X86_INS_JA) e.cond = RegEffect::jump_if_above;
        if (insn.id == X86_INS_CMP && insn.detail->x86.op_count == 2 && insn.detail->x86.operands[1].type == X86_OP_IMM) {
            e.compares_immediate = true;
            e.immediate = insn.detail->x86.operands[1].imm;
        }
        if (insn.id == X86_INS_JE) e.cond = RegEffect::jump_if_equal;
        if (insn.id == X86_INS_JNE) e.cond = RegEffect::jump_if_not_equal;
        if (insn.id == X86_INS_CMP && insn.detail->x86.op_count == 2 &&
            insn.detail->x86.operands[0].type == X86_OP_REG && insn.detail->x86.operands[1].type == X86_OP_REG &&
            insn.detail->x86.operands[0].size == 8) {
            e.compared[0] = static_cast<std::int8_t>(gp_index(insn.detail->x86.operands[0].reg));
            e.compared[1] = static_cast<std::int8_t>(gp_index(insn.detail->x86.operands[1].reg));
        }
        if (insn.id == X86_INS_CALL) {
            e.op = RegEffect::call;
            e.written = kCallClobbered;
            e.falls_through = !calls_noreturn(insn);
            return e;
        }
        const cs_x86& x86 = insn.detail->x86;
        if (x86.op_count == 2 && x86.operands[0].type == X86_OP_REG) {
            const int dst = gp_index(x86.operands[0].reg);
            const cs_x86_op& src = x86.operands[1];
            if (dst >= 0 && insn.id == X86_INS_LEA && src.type == X86_OP_MEM && src.mem.base == X86_REG_RIP &&
                src.mem.index == X86_REG_INVALID) {
                e.op = RegEffect::load_constant;
                e.dst = static_cast<std::int8_t>(dst);
                e.constant = insn.address + insn.size + src.mem.disp;
            } else if (dst >= 0 && (insn.id == X86_INS_MOV || insn.id == X86_INS_MOVABS) &&
                       src.type == X86_OP_IMM) {
                e.op = RegEffect::load_constant;
                e.dst = static_cast<std::int8_t>(dst);
                e.constant = x86.operands[0].size == 4 ? std::uint32_t(src.imm) : std::uint64_t(src.imm);
            } else if (dst >= 0 && insn.id == X86_INS_MOV && src.type == X86_OP_REG && gp_index(src.reg) >= 0 &&
                       x86.operands[0].size >= 4) {
                e.op = RegEffect::copy_register;
                e.dst = static_cast<std::int8_t>(dst);
                e.src = static_cast<std::int8_t>(gp_index(src.reg));
            }
        }
        cs_regs read, write;
        std::uint8_t nread = 0, nwrite = 0;
        if (cs_regs_access(cs_, &insn, read, &nread, write, &nwrite) == CS_ERR_OK) {
            for (std::uint8_t i = 0; i < nwrite; ++i) {
                const int r = gp_index(static_cast<x86_reg>(write[i]));
                if (r >= 0) e.written |= std::uint16_t(1u << r);
            }
        } else {
            e.written = 0xffff;
        }
        if (e.dst >= 0) e.written |= std::uint16_t(1u << e.dst);
        return e;
    }

    struct PendingSite {
        std::size_t index;  // in history_
        Hook hook;
        probelist::SiteForm form;
        bool aliased;
        std::uint8_t size;
        std::array<std::uint8_t, IPROBE_PL_SITE_MAX> bytes;
    };

    struct Search {
        std::set<std::pair<std::size_t, int>> visited;
        std::size_t budget = 200000;
        int depth = 0;
    };

    // Calls that never return (throw, unwind, abort): the next instruction
    // starts a block of its own, not reached from here.
    bool calls_noreturn(const cs_insn& insn) const {
        const cs_x86& x86 = insn.detail->x86;
        if (x86.op_count != 1 || x86.operands[0].type != X86_OP_IMM) return false;
        const auto target = static_cast<std::uint64_t>(x86.operands[0].imm);
        std::string_view name;
        if (const elf::PltEntry* plt = elf_.plt_entry_at(target)) name = plt->symbol;
        else if (const elf::ElfSymbol* f = elf_.function_starting_at(target)) name = f->name;
        static constexpr std::string_view kNoreturn[] = {
            "_Unwind_Resume", "__cxa_throw", "__cxa_rethrow", "__cxa_bad_cast", "__cxa_bad_typeid",
            "__cxa_throw_bad_array_new_length", "abort", "exit", "_exit", "_Exit", "quick_exit",
            "__stack_chk_fail", "__assert_fail", "__fortify_fail", "__chk_fail", "pthread_exit",
            "longjmp", "siglongjmp", "__longjmp_chk", "err", "errx", "verr", "verrx"};
        for (const auto n : kNoreturn)
            if (name == n) return true;
        return name.starts_with("_ZSt") && name.find("__throw_") != std::string_view::npos;
    }

    // The calls a landing pad is entered from, as predecessors of the pad.
    void add_landing_edges(const elf::ElfSection& section) {
        for (const auto& edge : landing_edges_) {
            if (!section.contains(edge.landing_pad)) continue;
            auto it = std::lower_bound(history_.begin(), history_.end(), edge.call_begin,
                                       [](const RegEffect& e, std::uint64_t a) { return e.address < a; });
            for (; it != history_.end() && it->address < edge.call_end; ++it)
                if (it->op == RegEffect::call)
                    branches_.emplace_back(edge.landing_pad, std::size_t(it - history_.begin()));
        }
    }

    // On this edge of a je/jne after `cmp a, b`, `reg` equals the other register.
    std::optional<int> equal_register(std::size_t branch, bool taken, int reg) const {
        const RegEffect& b = history_[branch];
        const auto wanted = taken ? RegEffect::jump_if_equal : RegEffect::jump_if_not_equal;
        if (b.cond != wanted || branch == 0) return std::nullopt;
        const RegEffect& cmp = history_[branch - 1];
        if (cmp.compared[0] == reg && cmp.compared[1] >= 0) return cmp.compared[1];
        if (cmp.compared[1] == reg && cmp.compared[0] >= 0) return cmp.compared[0];
        return std::nullopt;
    }

    // The value `reg` has when control leaves instruction `j` along an edge
    // (taken branch or fall-through).
    Reaching value_on_edge(std::size_t j, bool taken, int reg, Search& search) const {
        if (auto other = equal_register(j, taken, reg)) {
            const Reaching r = value_before(j - 1, *other, search);
            if (r.state == Reaching::known) return r;
        }
        return value_after(j, reg, search);
    }

    // gcc's switch tables: `cmp $N, r; ja default; ...; jmp *` through N+1
    // entries, either int32 offsets from a `lea table(%rip)` base (PIC) or
    // absolute 8-byte addresses (`jmp *table(,%r,8)`).  Their cases become
    // branch targets of the jmp.
    void record_jump_table(const cs_insn& insn, const elf::ElfSection& section) {
        if (insn.id != X86_INS_JMP) return;
        const cs_x86& x86 = insn.detail->x86;
        if (x86.op_count != 1) return;
        const cs_x86_op& op = x86.operands[0];
        const std::size_t jmp = history_.size() - 1;
        std::optional<std::uint64_t> count;
        std::optional<std::uint64_t> base;
        for (std::size_t i = jmp; i-- > 0 && jmp - i <= 12;) {
            const RegEffect& e = history_[i];
            if (!base && e.op == RegEffect::load_constant && op.type == X86_OP_REG) base = e.constant;
            if (e.cond == RegEffect::jump_if_above && i > 0 && history_[i - 1].compares_immediate &&
                history_[i - 1].immediate >= 0 && history_[i - 1].immediate < 4096) {
                count = static_cast<std::uint64_t>(history_[i - 1].immediate) + 1;
                break;
            }
        }
        if (!count) return;
        std::size_t entry_size = 4;
        if (op.type == X86_OP_MEM && op.mem.base == X86_REG_INVALID && op.mem.scale == 8) {
            base = static_cast<std::uint64_t>(op.mem.disp);
            entry_size = 8;
        }
        if (!base) return;
        const elf::ElfSection* table = elf_.section_containing(*base);
        if (!table || !table->has_file_bytes()) return;
        const auto bytes = elf_.section_bytes(*table);
        for (std::uint64_t n = 0; n < *count; ++n) {
            const std::uint64_t at = *base - table->address + n * entry_size;
            if (at + entry_size > bytes.size()) return;
            std::uint64_t raw = 0;
            std::memcpy(&raw, bytes.data() + at, entry_size);
            const std::uint64_t target =
                entry_size == 4 ? *base + static_cast<std::uint64_t>(std::int64_t(std::int32_t(raw))) : raw;
            if (section.contains(target)) branches_.emplace_back(target, jmp);
        }
    }

    void record_branch(const cs_insn& insn) {
        if (!cs_insn_group(cs_, &insn, X86_GRP_JUMP)) return;
        const cs_x86& x86 = insn.detail->x86;
        if (x86.op_count == 1 && x86.operands[0].type == X86_OP_IMM)
            branches_.emplace_back(static_cast<std::uint64_t>(x86.operands[0].imm), history_.size());
    }

    std::size_t index_of(std::uint64_t address) const {
        auto it = std::lower_bound(history_.begin(), history_.end(), address,
                                   [](const RegEffect& e, std::uint64_t a) { return e.address < a; });
        return it != history_.end() && it->address == address ? std::size_t(it - history_.begin()) : history_.size();
    }

    // The constant the hook call receives in %rdi (this_fn): gcc passes the
    // address of the instrumented function, which for a function inlined
    // here is not the enclosing one.  A reaching-definition search backwards
    // through fall-through and direct-branch predecessors (register copies
    // followed); known only when every path agrees on one constant.
    Reaching value_after(std::size_t j, int reg, Search& search) const {
        const RegEffect& e = history_[j];
        if (!(e.written & (1u << reg))) return value_before(j, reg, search);
        if (e.op == RegEffect::load_constant && e.dst == reg) return Reaching::of(e.constant);
        if (e.op == RegEffect::copy_register && e.dst == reg) return value_before(j, e.src, search);
        return Reaching::not_known();
    }

    Reaching value_before(std::size_t k, int reg, Search& search) const {
        if (++search.depth > 4096) return Reaching::not_known();
        struct DepthGuard {
            int& d;
            ~DepthGuard() { --d; }
        } guard{search.depth};
        for (;;) {
            if (search.budget-- == 0) return Reaching::not_known();
            const std::uint64_t here = history_[k].address;
            // A function's entry: %rdi & co. are its arguments.  A `f.cold`
            // piece is entered only by jumps from `f`.
            bool piece_start = false;
            if (const elf::ElfSymbol* f = elf_.function_starting_at(here)) {
                if (f->name.find(".cold") == std::string::npos) return Reaching::not_known();
                piece_start = true;
            }
            auto first = std::lower_bound(branches_.begin(), branches_.end(), std::make_pair(here, std::size_t(0)));
            const bool join = first != branches_.end() && first->first == here;
            const bool fall_in = k > 0 && history_[k - 1].falls_through && !piece_start;
            if (!join) {
                if (k == 0 || piece_start) return Reaching::not_known();
                if (!fall_in) {
                    if (history_[k].is_nop) return {};  // padding after a jump: never runs
                    return {Reaching::orphan, 0};
                }
                const RegEffect& prev = history_[k - 1];
                if (auto other = equal_register(k - 1, false, reg)) {
                    const Reaching r = value_before(k - 2, *other, search);
                    if (r.state == Reaching::known) return r;
                }
                if (prev.written & (1u << reg)) return value_after(k - 1, reg, search);
                --k;
                continue;
            }
            if (!search.visited.emplace(k, reg).second) return {};  // around a loop: nothing new
            Reaching result;
            for (auto it = first; it != branches_.end() && it->first == here; ++it) {
                result = result.merged(value_on_edge(it->second, true, reg, search));
                if (result.state == Reaching::unknown) return result;
            }
            if (fall_in) result = result.merged(value_on_edge(k - 1, false, reg, search));
            return result;
        }
    }

    std::optional<std::uint64_t> first_argument(std::size_t call_index) const {
        Search search;
        const Reaching r = value_before(call_index, kRdi, search);
        if (r.state == Reaching::known) return r.value;
        if (r.state == Reaching::orphan) return last_definition(call_index);
        return std::nullopt;
    }

    // For code no known branch reaches (a jump-table case, a landing pad
    // without LSDA): gcc lays such blocks out after code of the same
    // function, whose registers they usually inherit.  Walks straight back
    // through the listing, copies followed, to the function's start.
    std::optional<std::uint64_t> last_definition(std::size_t call_index) const {
        int reg = kRdi;
        for (std::size_t i = call_index; i-- > 0 && call_index - i < 8192;) {
            const RegEffect& e = history_[i];
            if (i + 1 < history_.size() && elf_.function_starting_at(history_[i + 1].address)) break;
            if (!(e.written & (1u << reg))) continue;
            if (e.op == RegEffect::load_constant && e.dst == reg) return e.constant;
            if (e.op != RegEffect::copy_register || e.dst != reg) break;
            reg = e.src;
        }
        return std::nullopt;
    }

    // Code gcc moved out of `f` (`f.cold`, `f.part.0`) or specialised
    // (`f.isra.0`, `f.constprop.0`) belongs to `f`, when `f` itself exists.
    const elf::ElfSymbol* original_of(const elf::ElfSymbol& symbol) const {
        std::size_t cut = std::string::npos;
        for (const char* suffix : {".cold", ".part.", ".isra.", ".constprop.", ".lto_priv."})
            cut = std::min(cut, symbol.name.find(suffix));
        if (cut == std::string::npos || cut == 0) return nullptr;
        const elf::ElfSymbol* original = elf_.symbol_named(std::string_view(symbol.name).substr(0, cut));
        return original && original->is_function() ? original : nullptr;
    }

    probelist::Probe make_probe(const PendingSite& site) const {
        probelist::Probe p;
        p.kind = site.hook == Hook::enter ? probelist::ProbeKind::entry : probelist::ProbeKind::exit;
        p.form = site.form;
        p.size = site.size;
        p.site = history_[site.index].address;
        std::copy(site.bytes.begin(), site.bytes.begin() + site.size, p.original.begin());
        if (site.form == probelist::SiteForm::call_rel32)
            std::copy(std::begin(kNop5), std::end(kNop5), p.placeholder.begin());
        else
            std::copy(std::begin(kNop6), std::end(kNop6), p.placeholder.begin());

        const elf::ElfSymbol* enclosing = elf_.function_at(p.site);
        const elf::ElfSymbol* named = nullptr;
        if (auto fn = first_argument(site.index)) {
            named = elf_.function_starting_at(*fn);
            p.function_address = *fn;
        } else {
            p.shared_site = true;
        }
        if (!named && enclosing) named = original_of(*enclosing);
        if (!named) named = enclosing;
        if (named) p.function_address = named->address;
        if (named) {
            p.function = named->name;
            p.demangled = elf::demangle(named->name);
        } else {
            char buf[32];
            std::snprintf(buf, sizeof buf, "fn_%llx", static_cast<unsigned long long>(p.function_address));
            p.function = p.demangled = buf;
        }
        return p;
    }

    const elf::ElfFile& elf_;
    const HookTargets& targets_;
    std::vector<LandingEdge> landing_edges_;
    csh cs_ = 0;
    cs_insn* insn_ = nullptr;
    std::vector<RegEffect> history_;                               // one section, by address
    std::vector<std::pair<std::uint64_t, std::size_t>> branches_;  // (target, index of the branch)
};

// Calls to a target that is both hooks carry no kind.  gcc places the entry
// call before the body and the exit calls after it, so per instrumented
// function (and enclosing function) the first call in address order is the
// entry and the rest are exits.  A function inlined twice into one caller
// defeats this; the result says how many kinds were inferred.
void infer_aliased_kinds(const elf::ElfFile& elf, std::vector<probelist::Probe>& probes, const std::vector<std::size_t>& aliased) {
    std::vector<std::size_t> order(aliased);
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return probes[a].site < probes[b].site; });
    std::set<std::pair<std::uint64_t, std::uint64_t>> seen;
    for (const std::size_t i : order) {
        const elf::ElfSymbol* enclosing = elf.function_at(probes[i].site);
        const auto key = std::make_pair(enclosing ? enclosing->address : 0, probes[i].function_address);
        probes[i].kind = seen.insert(key).second ? probelist::ProbeKind::entry : probelist::ProbeKind::exit;
    }
}

bool is_plt_section(const elf::ElfSection& s) {
    return s.name == ".plt" || s.name == ".plt.sec" || s.name == ".plt.got";
}

}  // namespace

PlaceholderScan scan_placeholders(const elf::ElfFile& elf, const std::string& module_name) {
    elf.require_x86_64_executable_or_library();
    PlaceholderScan scan;
    probelist::ProbeList& list = scan.list;
    list.flow = IPROBE_FLOW_FINSTRUMENT;
    list.module = module_name;
    list.build_id = elf.build_id();
    if (elf.is_position_independent()) list.flags |= IPROBE_PL_FLAG_PIE;
    if (elf.is_shared_library()) list.flags |= IPROBE_PL_FLAG_SHARED;

    const HookTargets targets = find_hook_targets(elf, list);
    if (targets.enter_calls.empty() && targets.exit_calls.empty() && targets.enter_slots.empty() &&
        targets.exit_slots.empty())
        return scan;
    Scanner scanner(elf, targets);
    for (const auto& section : elf.sections())
        if (section.executable() && section.has_file_bytes() && !is_plt_section(section))
            scanner.scan_section(section, list.probes, scan.hook_tail_jumps);
    infer_aliased_kinds(elf, list.probes, scanner.aliased);
    scan.kinds_inferred = scanner.aliased.size();

    if (!list.probes.empty()) {
        elf::SourceLines lines(elf);
        for (auto& p : list.probes) {
            if (auto where = lines.at(p.site)) {
                p.file = where->file;
                p.line = where->line;
                list.flags |= IPROBE_PL_FLAG_DWARF;
            }
        }
    }
    list.normalize();
    return scan;
}

}  // namespace iprobe::coldpatch
