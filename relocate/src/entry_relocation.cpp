#include "iprobe/relocate/entry_relocation.h"

#include <capstone/capstone.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <sstream>

#include "iprobe/support/error.h"

namespace iprobe::relocate {

namespace {

constexpr std::uint8_t kEndbr64[4] = {0xf3, 0x0f, 0x1e, 0xfa};
constexpr std::size_t kMaxTableEntries = 4096;

std::string hex(std::uint64_t v) {
    std::ostringstream s;
    s << "0x" << std::hex << v;
    return s.str();
}

// One Capstone handle with details on, closed on every path.
class Disassembler {
public:
    Disassembler() {
        if (cs_open(CS_ARCH_X86, CS_MODE_64, &handle_) != CS_ERR_OK)
            throw Error("capstone: cannot open an x86-64 disassembler", ExitCode::unavailable);
        cs_option(handle_, CS_OPT_DETAIL, CS_OPT_ON);
        insn_ = cs_malloc(handle_);
    }
    ~Disassembler() {
        if (insn_) cs_free(insn_, 1);
        cs_close(&handle_);
    }
    Disassembler(const Disassembler&) = delete;
    Disassembler& operator=(const Disassembler&) = delete;

    // Decodes the instruction at `*at` (address `*address`), advancing both.
    bool next(const std::uint8_t** at, std::size_t* left, std::uint64_t* address) {
        return cs_disasm_iter(handle_, at, left, address, insn_);
    }
    const cs_insn& insn() const { return *insn_; }
    const cs_x86& x86() const { return insn_->detail->x86; }
    bool in_group(std::uint8_t group) const { return cs_insn_group(handle_, insn_, group); }
    std::string text() const { return std::string(insn_->mnemonic) + " " + insn_->op_str; }

    // The target of a relative branch or call (its immediate operand).
    bool relative_target(std::uint64_t* target) const {
        if (!in_group(X86_GRP_BRANCH_RELATIVE)) return false;
        for (std::uint8_t i = 0; i < x86().op_count; i++)
            if (x86().operands[i].type == X86_OP_IMM) {
                *target = static_cast<std::uint64_t>(x86().operands[i].imm);
                return true;
            }
        return false;
    }
    // The memory operand, when the instruction has one.
    const cs_x86_op* memory_operand() const {
        for (std::uint8_t i = 0; i < x86().op_count; i++)
            if (x86().operands[i].type == X86_OP_MEM) return &x86().operands[i];
        return nullptr;
    }

private:
    csh handle_ = 0;
    cs_insn* insn_ = nullptr;
};

// Where a branch lands, and from which region of the sweep it came.
struct Target {
    std::uint64_t address;
    std::size_t region;
    bool call = false;
    bool operator<(const Target& o) const { return address < o.address; }
};

// A stretch of code swept on its own: a function, or the bytes between two.
struct Region {
    std::uint64_t low = 0, high = 0;
    std::span<const std::uint8_t> bytes;
    std::ptrdiff_t function = -1;  // index in `functions`, -1 for a gap
};

// The cases of the jump tables a region's code could use: each table its
// code takes the address of (lea disp(%rip), or the absolute base of
// jmp *disp(,%reg,8)) read entry by entry while the entries land inside the
// region.  gcc and clang lay out PIC tables as 32-bit offsets from the
// table, absolute ones as 64-bit addresses.
void table_targets(const std::vector<std::uint64_t>& relative_tables, const std::vector<std::uint64_t>& absolute_tables,
                   const Region& region, std::size_t index, const ReadBytes& read, std::vector<Target>& out) {
    auto inside = [&](std::uint64_t t) { return t >= region.low && t < region.high; };
    for (const std::uint64_t table : relative_tables)
        for (std::size_t i = 0; i < kMaxTableEntries; i++) {
            std::int32_t entry;
            if (!read(table + 4 * i, &entry, sizeof entry)) break;
            const std::uint64_t t = table + static_cast<std::int64_t>(entry);
            if (!inside(t)) break;
            out.push_back({t, index, false});
        }
    for (const std::uint64_t table : absolute_tables)
        for (std::size_t i = 0; i < kMaxTableEntries; i++) {
            std::uint64_t t;
            if (!read(table + 8 * i, &t, sizeof t) || !inside(t)) break;
            out.push_back({t, index, false});
        }
}

struct Sweep {
    std::vector<Target> targets;
    std::vector<bool> undecodable;       // per region
    std::vector<std::string> indirect;   // per region: an indirect jump without a table ("" if none)
};

// Every branch target of every region, decoded linearly.
Sweep sweep(Disassembler& dis, const std::vector<Region>& regions, const ReadBytes& read) {
    Sweep s;
    s.undecodable.assign(regions.size(), false);
    s.indirect.assign(regions.size(), {});
    for (std::size_t r = 0; r < regions.size(); r++) {
        const Region& region = regions[r];
        const std::uint8_t* at = region.bytes.data();
        std::size_t left = region.bytes.size();
        std::uint64_t address = region.low;
        std::vector<std::uint64_t> relative_tables, absolute_tables;
        std::string indirect;
        while (left > 0) {
            if (!dis.next(&at, &left, &address)) {
                if (region.function >= 0) {
                    s.undecodable[r] = true;
                    break;
                }
                at++, left--, address++;  // padding or data between functions: resynchronise
                continue;
            }
            std::uint64_t target;
            const unsigned id = dis.insn().id;
            if (dis.relative_target(&target)) {
                const bool call = dis.in_group(X86_GRP_CALL);
                s.targets.push_back({target, r, call});
                continue;
            }
            const cs_x86_op* mem = dis.memory_operand();
            if (id == X86_INS_LEA && mem && mem->mem.base == X86_REG_RIP) {
                relative_tables.push_back(address + static_cast<std::int64_t>(mem->mem.disp));
                continue;
            }
            if (id != X86_INS_JMP || !dis.in_group(X86_GRP_JUMP)) continue;
            // An indirect jump: through the GOT (a tail call), or a table.
            if (mem && mem->mem.base == X86_REG_RIP) continue;
            if (mem && mem->mem.base == X86_REG_INVALID && mem->mem.index != X86_REG_INVALID && mem->mem.scale == 8)
                absolute_tables.push_back(static_cast<std::uint64_t>(mem->mem.disp));
            else if (indirect.empty())
                indirect = dis.text() + " at " + hex(address - dis.insn().size);
        }
        const std::size_t before = s.targets.size();
        table_targets(relative_tables, absolute_tables, region, r, read, s.targets);
        const bool tables_found = s.targets.size() > before;
        // A register jump with no table in sight may go anywhere in the function.
        if (!indirect.empty() && !tables_found && absolute_tables.empty()) s.indirect[r] = indirect;
    }
    std::sort(s.targets.begin(), s.targets.end());
    return s;
}

std::vector<Region> regions_of(std::span<const CodeRange> code, std::span<const FunctionRange> functions) {
    std::vector<Region> regions;
    std::size_t f = 0;
    for (const CodeRange& c : code) {
        // Sizes come from the file: an end past 2^64 is clamped, never wrapped.
        const std::uint64_t end = c.address + std::min<std::uint64_t>(c.bytes.size(), ~std::uint64_t{0} - c.address);
        std::uint64_t at = c.address;
        auto add = [&](std::uint64_t low, std::uint64_t high, std::ptrdiff_t function) {
            if (high <= low) return;
            regions.push_back({low, high, c.bytes.subspan(low - c.address, high - low), function});
        };
        while (f < functions.size() && functions[f].address < c.address) f++;
        for (; f < functions.size() && functions[f].address < end; f++) {
            const FunctionRange& fn = functions[f];
            const std::uint64_t high = fn.size < end - fn.address ? fn.address + fn.size : end;
            if (fn.address < at) {  // overlaps the one before: sweep what it adds
                add(at, high, static_cast<std::ptrdiff_t>(f));
                at = std::max(at, high);
                continue;
            }
            add(at, fn.address, -1);
            add(fn.address, high, static_cast<std::ptrdiff_t>(f));
            at = high;
        }
        add(at, end, -1);
    }
    return regions;
}

// The first instructions of a function, at least kJumpSize bytes after any
// endbr64, each checked for running elsewhere.
EntryPlan plan_moved(Disassembler& dis, std::uint64_t address, std::span<const std::uint8_t> code) {
    EntryPlan plan;
    if (code.size() >= sizeof kEndbr64 && std::memcmp(code.data(), kEndbr64, sizeof kEndbr64) == 0)
        plan.skip = sizeof kEndbr64;
    if (code.size() < plan.skip + kJumpSize) {
        plan.refusal = Refusal::too_short;
        plan.detail = std::to_string(code.size()) + " bytes";
        return plan;
    }
    const std::uint8_t* at = code.data() + plan.skip;
    std::size_t left = code.size() - plan.skip;
    std::uint64_t pc = address + plan.skip;
    std::size_t moved = 0;
    while (moved < kJumpSize) {
        if (!dis.next(&at, &left, &pc)) {
            plan.refusal = left == 0 ? Refusal::too_short : Refusal::undecodable;
            plan.detail = "at " + hex(pc);
            return plan;
        }
        moved += dis.insn().size;
        std::uint64_t target;
        const bool relative = dis.relative_target(&target);
        const unsigned id = dis.insn().id;
        const bool reencodable = id == X86_INS_CALL || id == X86_INS_JMP ||
                                 (dis.in_group(X86_GRP_JUMP) && dis.x86().opcode[0] != 0xe0 &&
                                  dis.x86().opcode[0] != 0xe1 && dis.x86().opcode[0] != 0xe2 &&
                                  dis.x86().opcode[0] != 0xe3);
        if (relative && !reencodable) {
            plan.refusal = Refusal::unrelocatable;
            plan.detail = dis.text() + " at " + hex(pc - dis.insn().size);
            return plan;
        }
        if (dis.in_group(X86_GRP_CALL) && moved < kJumpSize) {
            plan.refusal = Refusal::unrelocatable;
            plan.detail = dis.text() + " at " + hex(pc - dis.insn().size) + " returns into the bytes the jump replaces";
            return plan;
        }
        // A moved call pushes its return address itself (trampoline()),
        // before its target is read: not a far call, nor one reading the
        // stack it moves.
        const cs_x86_op* operand = dis.memory_operand();
        if (dis.in_group(X86_GRP_CALL) &&
            (id != X86_INS_CALL || (operand && (operand->mem.base == X86_REG_RSP || operand->mem.index == X86_REG_RSP)))) {
            plan.refusal = Refusal::unrelocatable;
            plan.detail = dis.text() + " at " + hex(pc - dis.insn().size) + " reads the stack its return address goes on";
            return plan;
        }
    }
    plan.length = static_cast<std::uint8_t>(moved);
    return plan;
}

// Puts `disp` where `old_disp` is in the copy of an instruction at `bytes`
// (running at `at`) and checks, by decoding the result, that it references
// `referenced`.  Capstone's encoding.disp_offset is 0 for some SSE forms, so
// the other places holding the old displacement are tried too.
bool rewrite_displacement(Disassembler& dis, std::uint8_t* bytes, std::size_t size, std::int32_t old_disp,
                          std::int32_t disp, std::uint64_t at, std::uint64_t referenced) {
    std::vector<std::size_t> places;
    if (const std::uint8_t o = dis.x86().encoding.disp_offset; o != 0 && o + 4u <= size) places.push_back(o);
    for (std::size_t o = 1; o + 4 <= size; o++)
        if (std::memcmp(bytes + o, &old_disp, 4) == 0) places.push_back(o);
    std::vector<std::uint8_t> copy(bytes, bytes + size);
    for (const std::size_t o : places) {
        std::vector<std::uint8_t> attempt = copy;
        std::memcpy(attempt.data() + o, &disp, 4);
        const std::uint8_t* p = attempt.data();
        std::size_t left = attempt.size();
        std::uint64_t address = at;
        if (!dis.next(&p, &left, &address) || left != 0) continue;
        const cs_x86_op* mem = dis.memory_operand();
        if (!mem || mem->mem.base != X86_REG_RIP || address + static_cast<std::int64_t>(mem->mem.disp) != referenced)
            continue;
        std::memcpy(bytes, attempt.data(), size);
        return true;
    }
    return false;
}

}  // namespace

std::string_view to_string(Refusal refusal) {
    switch (refusal) {
    case Refusal::none: return "ok";
    case Refusal::too_short: return "too short";
    case Refusal::branch_into_entry: return "branch into entry";
    case Refusal::indirect_jump: return "indirect jump";
    case Refusal::unrelocatable: return "unrelocatable instruction";
    case Refusal::undecodable: return "undecodable";
    }
    return "?";
}

std::vector<EntryPlan> plan_entries(std::span<const CodeRange> code, std::span<const FunctionRange> functions,
                                    const ReadBytes& read) {
    Disassembler dis;
    const std::vector<Region> regions = regions_of(code, functions);
    const Sweep swept = sweep(dis, regions, read);
    std::vector<std::ptrdiff_t> region_of(functions.size(), -1);
    for (std::size_t r = 0; r < regions.size(); r++)
        if (regions[r].function >= 0 && region_of[static_cast<std::size_t>(regions[r].function)] < 0)
            region_of[static_cast<std::size_t>(regions[r].function)] = static_cast<std::ptrdiff_t>(r);

    std::vector<EntryPlan> plans(functions.size());
    for (std::size_t f = 0; f < functions.size(); f++) {
        EntryPlan& plan = plans[f];
        const std::ptrdiff_t r = region_of[f];
        if (r < 0) {
            plan.refusal = Refusal::undecodable;
            plan.detail = "outside the executable sections";
            continue;
        }
        const Region& region = regions[static_cast<std::size_t>(r)];
        const std::uint64_t start = functions[f].address;
        if (region.low != start) {
            plan.refusal = Refusal::undecodable;
            plan.detail = "overlaps the function before it";
            continue;
        }
        plan = plan_moved(dis, start, region.bytes);
        if (!plan.ok()) continue;
        if (swept.undecodable[static_cast<std::size_t>(r)]) {
            plan = {Refusal::undecodable, "cannot decode all of it", 0, 0};
            continue;
        }
        if (!swept.indirect[static_cast<std::size_t>(r)].empty()) {
            plan = {Refusal::indirect_jump, swept.indirect[static_cast<std::size_t>(r)] + " (no jump table found)", 0, 0};
            continue;
        }
        // Anything landing in [start, site + length) but a call of the
        // function: a jump to the very start from elsewhere is a tail call
        // (a call, entering it); from inside, a loop that would count as one.
        const std::uint64_t end = start + plan.skip + plan.length;
        for (auto it = std::lower_bound(swept.targets.begin(), swept.targets.end(), Target{start, 0, false});
             it != swept.targets.end() && it->address < end; ++it) {
            if (it->address == start && (it->call || it->region != static_cast<std::size_t>(r))) continue;
            const Region& from = regions[it->region];
            plan = {Refusal::branch_into_entry,
                    "a branch from " + hex(from.low) + (from.function >= 0 ? " (a function)" : " (code without a symbol)") +
                        " lands at +" + std::to_string(it->address - start),
                    0, 0};
            break;
        }
    }
    return plans;
}

std::vector<std::uint8_t> trampoline(std::span<const std::uint8_t> moved, std::uint64_t site, std::uint64_t at) {
    Disassembler dis;
    std::vector<std::uint8_t> out;
    auto rel32 = [&](std::uint64_t from_end, std::uint64_t to) {
        const std::int64_t rel = static_cast<std::int64_t>(to - from_end);
        if (rel < INT32_MIN || rel > INT32_MAX)
            throw Error("trampoline at " + hex(at) + " is out of rel32 reach of " + hex(to));
        return static_cast<std::int32_t>(rel);
    };
    auto put32 = [&](std::int32_t v) {
        const auto* b = reinterpret_cast<const std::uint8_t*>(&v);
        out.insert(out.end(), b, b + 4);
    };
    // A call leaves the return address it would have left in place: the
    // callee's unwinder, a debugger's backtrace and runtimes that read their
    // callers' return addresses must find the function's own code there,
    // not the trampoline, which no unwind table describes (a C++ throw or
    // a Rust panic beneath it ended in std::terminate or "failed to
    // initiate panic").  push $low (sign-extended), movl $high, 4(%rsp),
    // then the call's jump; nothing but the stack changes, as with call.
    auto push_return = [&](std::uint64_t return_address) {
        out.push_back(0x68);
        put32(static_cast<std::int32_t>(return_address & 0xffffffffu));
        const std::uint8_t high[] = {0xc7, 0x44, 0x24, 0x04};
        out.insert(out.end(), high, high + sizeof high);
        put32(static_cast<std::int32_t>(return_address >> 32));
    };
    const std::uint8_t* code = moved.data();
    std::size_t left = moved.size();
    std::uint64_t pc = site;
    while (left > 0) {
        if (!dis.next(&code, &left, &pc)) throw Error("cannot decode the entry at " + hex(pc));
        const cs_insn& insn = dis.insn();
        const bool call = insn.id == X86_INS_CALL;
        if (call) push_return(pc);
        std::uint64_t target;
        if (dis.relative_target(&target)) {
            const std::uint8_t op = dis.x86().opcode[0];
            if (call || insn.id == X86_INS_JMP) {
                out.push_back(0xe9);
            } else if (op >= 0x70 && op <= 0x7f) {  // jcc rel8 -> jcc rel32
                out.push_back(0x0f);
                out.push_back(static_cast<std::uint8_t>(0x80 + (op - 0x70)));
            } else if (op == 0x0f && dis.x86().opcode[1] >= 0x80 && dis.x86().opcode[1] <= 0x8f) {
                out.push_back(0x0f);
                out.push_back(dis.x86().opcode[1]);
            } else {
                throw Error("cannot relocate " + dis.text() + " at " + hex(pc - insn.size));
            }
            put32(rel32(at + out.size() + 4, target));
            continue;
        }
        const std::size_t begin = out.size();
        out.insert(out.end(), insn.bytes, insn.bytes + insn.size);
        if (call) {  // call *X (FF /2) becomes jmp *X (FF /4)
            const std::uint8_t modrm_at = dis.x86().encoding.modrm_offset;
            if (dis.x86().opcode[0] != 0xff || modrm_at == 0 || modrm_at >= insn.size ||
                ((out[begin + modrm_at] >> 3) & 7) != 2)
                throw Error("cannot relocate " + dis.text() + " at " + hex(pc - insn.size));
            out[begin + modrm_at] = static_cast<std::uint8_t>((out[begin + modrm_at] & 0xc7) | (4 << 3));
        }
        const cs_x86_op* mem = dis.memory_operand();
        if (mem && mem->mem.base == X86_REG_RIP) {
            const std::uint64_t referenced = pc + static_cast<std::int64_t>(mem->mem.disp);
            const std::int32_t disp = rel32(at + begin + insn.size, referenced);
            const std::string text = dis.text();
            if (!rewrite_displacement(dis, out.data() + begin, insn.size, static_cast<std::int32_t>(mem->mem.disp), disp,
                                      at + begin, referenced))
                throw Error("cannot find the displacement of " + text + " at " + hex(pc - insn.size));
        }
    }
    out.push_back(0xe9);
    put32(rel32(at + out.size() + 4, site + moved.size()));
    if (out.size() > kMaxTrampoline)
        throw Error("the relocated entry at " + hex(site) + " needs " + std::to_string(out.size()) + " bytes, more than " +
                    std::to_string(kMaxTrampoline));
    return out;
}

}  // namespace iprobe::relocate
