// Exception edges: which call ranges unwind into which landing pad, from
// .eh_frame (FDE -> LSDA pointer) and .gcc_except_table (call-site table).
// Coldpatch needs them because the exit hooks gcc runs during unwinding sit
// in landing pads, which no branch instruction reaches.
#include "landing_pads.h"

#include <optional>

namespace iprobe::coldpatch {

namespace {

constexpr std::uint8_t kOmit = 0xff;

// A cursor over the bytes of one allocated section, at link-time addresses.
class Reader {
public:
    Reader(std::span<const std::uint8_t> bytes, std::uint64_t base) : bytes_(bytes), base_(base) {}

    bool ok() const { return ok_; }
    std::size_t offset() const { return pos_; }
    void seek(std::size_t offset) { pos_ = offset, ok_ = ok_ && offset <= bytes_.size(); }
    std::uint64_t address() const { return base_ + pos_; }
    bool at_end() const { return pos_ >= bytes_.size(); }

    std::uint64_t fixed(std::size_t size) {
        if (!ok_ || pos_ + size > bytes_.size()) return ok_ = false, 0;
        std::uint64_t v = 0;
        for (std::size_t i = 0; i < size; ++i) v |= std::uint64_t(bytes_[pos_ + i]) << (8 * i);
        pos_ += size;
        return v;
    }
    std::uint64_t uleb() {
        std::uint64_t v = 0;
        for (unsigned shift = 0; ok_; shift += 7) {
            const std::uint8_t b = static_cast<std::uint8_t>(fixed(1));
            if (shift < 64) v |= std::uint64_t(b & 0x7f) << shift;
            if (!(b & 0x80)) break;
        }
        return v;
    }
    std::int64_t sleb() {
        std::int64_t v = 0;
        unsigned shift = 0;
        std::uint8_t b = 0;
        do {
            b = static_cast<std::uint8_t>(fixed(1));
            if (shift < 64) v |= std::int64_t(b & 0x7f) << shift;
            shift += 7;
        } while (ok_ && (b & 0x80));
        if (shift < 64 && (b & 0x40)) v |= -(std::int64_t(1) << shift);
        return v;
    }
    std::string cstring() {
        std::string s;
        while (ok_) {
            const char c = static_cast<char>(fixed(1));
            if (!c) break;
            s += c;
        }
        return s;
    }
    // A DW_EH_PE-encoded pointer (pcrel relative to where it is read).
    std::optional<std::uint64_t> pointer(std::uint8_t encoding) {
        if (encoding == kOmit) return std::nullopt;
        const std::uint64_t here = address();
        std::uint64_t v = 0;
        switch (encoding & 0x0f) {
            case 0x00: v = fixed(8); break;
            case 0x01: v = uleb(); break;
            case 0x02: v = fixed(2); break;
            case 0x03: v = fixed(4); break;
            case 0x04: v = fixed(8); break;
            case 0x09: v = static_cast<std::uint64_t>(sleb()); break;
            case 0x0a: v = static_cast<std::uint64_t>(std::int64_t(std::int16_t(fixed(2)))); break;
            case 0x0b: v = static_cast<std::uint64_t>(std::int64_t(std::int32_t(fixed(4)))); break;
            case 0x0c: v = fixed(8); break;
            default: ok_ = false; return std::nullopt;
        }
        switch (encoding & 0x70) {  // bit 0x80 (indirect) is left to the caller
            case 0x00: break;
            case 0x10: v += here; break;
            default: ok_ = false; return std::nullopt;  // datarel, textrel, funcrel: not emitted on x86-64
        }
        return v;  // for DW_EH_PE_indirect (personality routines) the address of the pointer
    }

private:
    std::span<const std::uint8_t> bytes_;
    std::uint64_t base_;
    std::size_t pos_ = 0;
    bool ok_ = true;
};

struct Cie {
    std::uint8_t fde_encoding = 0;
    std::uint8_t lsda_encoding = kOmit;
    bool augmented = false;
};

std::optional<Cie> read_cie(Reader r) {
    Cie cie;
    const std::uint8_t version = static_cast<std::uint8_t>(r.fixed(1));
    const std::string augmentation = r.cstring();
    if (version != 1 && version != 3) return std::nullopt;
    r.uleb();  // code alignment
    r.sleb();  // data alignment
    if (version == 1) r.fixed(1); else r.uleb();  // return address register
    if (augmentation.empty() || augmentation[0] != 'z') return r.ok() ? std::optional(cie) : std::nullopt;
    cie.augmented = true;
    r.uleb();  // augmentation data length
    for (const char c : augmentation.substr(1)) {
        if (c == 'R') cie.fde_encoding = static_cast<std::uint8_t>(r.fixed(1));
        else if (c == 'L') cie.lsda_encoding = static_cast<std::uint8_t>(r.fixed(1));
        else if (c == 'P') r.pointer(static_cast<std::uint8_t>(r.fixed(1)));
        else if (c == 'S' || c == 'B' || c == 'G') continue;
        else return std::nullopt;
    }
    return r.ok() ? std::optional(cie) : std::nullopt;
}

void read_lsda(const elf::ElfFile& elf, std::uint64_t lsda, std::uint64_t function_start, std::vector<LandingEdge>& out) {
    const elf::ElfSection* table = elf.section_containing(lsda);
    if (!table || !table->has_file_bytes()) return;
    Reader r(elf.section_bytes(*table), table->address);
    r.seek(lsda - table->address);
    const std::uint8_t lpstart_encoding = static_cast<std::uint8_t>(r.fixed(1));
    const std::uint64_t lpstart = r.pointer(lpstart_encoding).value_or(function_start);
    if (static_cast<std::uint8_t>(r.fixed(1)) != kOmit) r.uleb();  // type table offset
    const std::uint8_t call_site_encoding = static_cast<std::uint8_t>(r.fixed(1));
    const std::uint64_t length = r.uleb();
    const std::size_t end = r.offset() + length;
    while (r.ok() && r.offset() < end) {
        const auto start = r.pointer(call_site_encoding & 0x0f);
        const auto size = r.pointer(call_site_encoding & 0x0f);
        const auto pad = r.pointer(call_site_encoding & 0x0f);
        r.uleb();  // action
        if (!r.ok() || !start || !size || !pad) return;
        if (*pad != 0) out.push_back({lpstart + *pad, function_start + *start, function_start + *start + *size});
    }
}

}  // namespace

std::vector<LandingEdge> landing_edges(const elf::ElfFile& elf) {
    std::vector<LandingEdge> edges;
    const elf::ElfSection* eh = elf.section(".eh_frame");
    if (!eh || !eh->has_file_bytes()) return edges;
    Reader r(elf.section_bytes(*eh), eh->address);
    while (r.ok() && !r.at_end()) {
        const std::size_t record = r.offset();
        std::uint64_t length = r.fixed(4);
        if (length == 0) break;  // terminator
        if (length == 0xffffffff) length = r.fixed(8);
        const std::size_t body = r.offset();
        const std::size_t next = body + length;
        const std::uint32_t id = static_cast<std::uint32_t>(r.fixed(4));
        if (id != 0) {  // an FDE: id is the distance back to its CIE
            Reader cie_reader = r;
            cie_reader.seek(body - id + 8);  // past the CIE's length and id
            const auto cie = read_cie(cie_reader);
            if (cie && cie->augmented && cie->lsda_encoding != kOmit) {
                const auto start = r.pointer(cie->fde_encoding);
                r.pointer(cie->fde_encoding & 0x0f);  // range
                r.uleb();                              // augmentation data length
                const auto lsda = r.pointer(cie->lsda_encoding);
                if (start && lsda && *lsda) read_lsda(elf, *lsda, *start, edges);
            }
        }
        (void)record;
        r.seek(next);
    }
    return edges;
}

}  // namespace iprobe::coldpatch
