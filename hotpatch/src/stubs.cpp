#include "stubs.h"

#include <algorithm>
#include <climits>
#include <initializer_list>
#include <sstream>

#include "iprobe/support/error.h"

namespace iprobe::hotpatch {

namespace {
constexpr std::uint64_t kPage = 4096;
}  // namespace

std::string hex_address(std::uint64_t v) {
    std::ostringstream s;
    s << "0x" << std::hex << v;
    return s.str();
}

std::array<std::uint8_t, kStubSize> stub_bytes(std::uint64_t target) {
    std::array<std::uint8_t, kStubSize> b{0xff, 0x25, 0x02, 0x00, 0x00, 0x00, 0xcc, 0xcc};
    std::memcpy(b.data() + 8, &target, 8);
    return b;
}

namespace {
constexpr std::uint8_t kJumpRipIndirect[6] = {0xff, 0x25, 0x00, 0x00, 0x00, 0x00};  // jmp *0(%rip)

// Writes a stub's bytes one after the other (the rest stays int3).
struct StubWriter {
    std::array<std::uint8_t, kSiteStubSize> bytes;
    std::size_t at = 0;
    StubWriter() { bytes.fill(0xcc); }
    void put(std::initializer_list<std::uint8_t> values) {
        for (auto v : values) bytes[at++] = v;
    }
    void put(const std::uint8_t* values, std::size_t n) {
        std::memcpy(bytes.data() + at, values, n);
        at += n;
    }
    void put32(std::uint32_t v) { put(reinterpret_cast<const std::uint8_t*>(&v), 4); }
};
constexpr std::uint8_t kLoadStatsRax[5] = {0x64, 0x48, 0x8b, 0x04, 0x25};  // mov %fs:disp32, %rax
constexpr std::uint8_t kLoadStatsR11[5] = {0x64, 0x4c, 0x8b, 0x1c, 0x25};  // mov %fs:disp32, %r11
constexpr std::size_t kCountStubSlowPath = 23;
constexpr std::size_t kIdStubSize = 19;
}  // namespace

std::array<std::uint8_t, kSiteStubSize> site_stub_bytes(std::uint32_t id, std::uint64_t target) {
    std::array<std::uint8_t, kSiteStubSize> b;
    b.fill(0xcc);
    b[0] = 0xbf;  // mov $id, %edi
    std::memcpy(b.data() + 1, &id, 4);
    std::memcpy(b.data() + 5, kJumpRipIndirect, sizeof kJumpRipIndirect);
    std::memcpy(b.data() + 11, &target, 8);
    return b;
}

std::array<std::uint8_t, kSiteStubSize> count_stub_bytes(std::int32_t stats_tpoff, std::uint32_t counter_offset,
                                                         std::uint64_t slow_target) {
    StubWriter w;
    w.put(kLoadStatsRax, sizeof kLoadStatsRax);
    w.put32(static_cast<std::uint32_t>(stats_tpoff));
    w.put({0x48, 0x85, 0xc0});                                           // test %rax, %rax
    w.put({0x74, static_cast<std::uint8_t>(kCountStubSlowPath - 14)});   // je slow
    w.put({0x48, 0x83, 0x80});                                           // addq $imm8, disp32(%rax)
    w.put32(counter_offset);
    w.put({0x01, 0xc3});                                                 // $1; ret
    w.at = kCountStubSlowPath;
    w.put(site_stub_bytes(counter_offset, slow_target).data(), kIdStubSize);
    return w.bytes;
}

namespace {
constexpr std::uint8_t kPushImm = 0x68;                            // push $imm32
constexpr std::uint8_t kPushRip[2] = {0xff, 0x35};                 // push disp32(%rip)
constexpr std::uint8_t kPushR11[2] = {0x41, 0x53};
constexpr std::uint8_t kPopR11[2] = {0x41, 0x5b};
constexpr std::size_t kEntryCountSlowPath = 32;

std::uint32_t rel32_to(std::uint64_t from_end, std::uint64_t to) {
    const std::int64_t rel = static_cast<std::int64_t>(to) - static_cast<std::int64_t>(from_end);
    if (rel < INT32_MIN || rel > INT32_MAX)
        throw Error("stub at " + hex_address(from_end) + " is out of rel32 reach of " + hex_address(to));
    return static_cast<std::uint32_t>(static_cast<std::int32_t>(rel));
}

// push site_end(%rip); push $id; jmp *0(%rip); .quad target; .quad site_end
// at `b[0]`.  No register changes: r11 is the caller's, which gcc's IPA-RA
// may keep live across the call.
void put_entry_stub(std::uint8_t* b, std::uint32_t id, std::uint64_t site_end, std::uint64_t target) {
    std::memcpy(b, kPushRip, sizeof kPushRip);
    const std::uint32_t to_site_end = 25 - 6;
    std::memcpy(b + 2, &to_site_end, 4);
    b[6] = kPushImm;
    std::memcpy(b + 7, &id, 4);
    std::memcpy(b + 11, kJumpRipIndirect, sizeof kJumpRipIndirect);
    std::memcpy(b + 17, &target, 8);
    std::memcpy(b + 25, &site_end, 8);
}

bool is_entry_stub(const std::uint8_t* stub, std::size_t size) {
    return size >= kEntryStubSize && std::memcmp(stub, kPushRip, sizeof kPushRip) == 0 && stub[6] == kPushImm &&
           std::memcmp(stub + 11, kJumpRipIndirect, sizeof kJumpRipIndirect) == 0;
}
}  // namespace

std::array<std::uint8_t, kSiteStubSize> entry_stub_bytes(std::uint32_t id, std::uint64_t site_end,
                                                         std::uint64_t target) {
    if (id > INT32_MAX) throw Error("site id " + std::to_string(id) + " does not fit a push");
    std::array<std::uint8_t, kSiteStubSize> b;
    b.fill(0xcc);
    put_entry_stub(b.data(), id, site_end, target);
    return b;
}

std::array<std::uint8_t, kSiteStubSize> entry_count_stub_bytes(std::int32_t stats_tpoff, std::uint32_t calls,
                                                               std::uint64_t at, std::uint64_t site_end,
                                                               std::uint64_t slow_target) {
    if (calls > INT32_MAX) throw Error("counter offset " + std::to_string(calls) + " does not fit a push");
    StubWriter w;
    w.put(kPushR11, sizeof kPushR11);
    w.put(kLoadStatsR11, sizeof kLoadStatsR11);
    w.put32(static_cast<std::uint32_t>(stats_tpoff));
    w.put({0x4d, 0x85, 0xdb});                                             // test %r11, %r11
    w.put({0x74, 0x08});                                                   // je 1f
    w.put({0x49, 0x83, 0x83});                                             // addq $imm8, disp32(%r11)
    w.put32(calls);
    w.put({0x01});                                                         // $1 (the sum is never 0 after it)
    w.put(kPopR11, sizeof kPopR11);                                        // 1: pop %r11 (flags kept)
    w.put({0x0f, 0x85});                                                   // jne site_end: counted
    w.put32(rel32_to(at + w.at + 4, site_end));
    put_entry_stub(w.bytes.data() + kEntryCountSlowPath, calls, site_end, slow_target);
    return w.bytes;
}

std::uint64_t stub_target(const std::uint8_t* stub, std::size_t size) {
    std::uint64_t target = 0;
    if (size >= kEntryCountSlowPath + kEntryStubSize && std::memcmp(stub, kPushR11, sizeof kPushR11) == 0 &&
        std::memcmp(stub + 2, kLoadStatsR11, sizeof kLoadStatsR11) == 0)
        return stub_target(stub + kEntryCountSlowPath, size - kEntryCountSlowPath);
    if (is_entry_stub(stub, size)) {
        std::memcpy(&target, stub + 17, 8);
        return target;
    }
    if (size >= kCountStubSlowPath + kIdStubSize && std::memcmp(stub, kLoadStatsRax, sizeof kLoadStatsRax) == 0)
        return stub_target(stub + kCountStubSlowPath, size - kCountStubSlowPath);
    if (size >= kStubSize && stub[0] == 0xff && stub[1] == 0x25 && stub[2] == 0x02 && stub[3] == 0 && stub[4] == 0 &&
        stub[5] == 0)
        std::memcpy(&target, stub + 8, 8);
    else if (size >= kIdStubSize && stub[0] == 0xbf && std::memcmp(stub + 5, kJumpRipIndirect, sizeof kJumpRipIndirect) == 0)
        std::memcpy(&target, stub + 11, 8);
    return target;
}

SiteBytes call_bytes(std::uint64_t site, std::uint8_t size, std::uint64_t stub) {
    const std::uint64_t call_at = size == 6 ? site + 1 : site;
    const std::int64_t rel = static_cast<std::int64_t>(stub) - static_cast<std::int64_t>(call_at + 5);
    if (rel < INT32_MIN || rel > INT32_MAX)
        throw Error("stub at " + hex_address(stub) + " is out of call rel32 reach of site " + hex_address(site));
    const auto rel32 = static_cast<std::uint32_t>(static_cast<std::int32_t>(rel));
    SiteBytes b;
    b.size = size == 6 ? 6 : 5;
    std::size_t at = 0;
    if (size == 6) b.bytes[at++] = 0x90;
    b.bytes[at++] = 0xe8;
    for (int i = 0; i < 4; i++) b.bytes[at++] = static_cast<std::uint8_t>(rel32 >> (8 * i));
    return b;
}

SiteBytes jump_bytes(std::uint64_t site, std::uint8_t size, std::uint64_t stub) {
    SiteBytes b = call_bytes(site, size, stub);
    b.bytes[b.size - 5] = 0xe9;
    return b;
}

std::uint64_t called_stub(std::uint64_t site, const std::uint8_t* bytes, std::uint8_t size) {
    std::size_t at = 0;
    if (size == 6) {
        if (bytes[0] != 0x90) return 0;
        at = 1;
    }
    if (bytes[at] != 0xe8 && bytes[at] != 0xe9) return 0;
    std::int32_t rel;
    std::memcpy(&rel, bytes + at + 1, 4);
    return site + at + 5 + static_cast<std::int64_t>(rel);
}

bool StubChecker::calls_a_stub(std::uint64_t site, const std::uint8_t* bytes, std::uint8_t size) {
    const std::uint64_t target = called_stub(site, bytes, size);
    if (target == 0) return false;
    auto [it, fresh] = known_.try_emplace(target, false);
    if (fresh) {
        // A shared stub may end its page; a site stub is longer.
        std::uint8_t stub[kSiteStubSize];
        for (std::size_t size : {kSiteStubSize, kStubSize}) try {
                memory_.read(target, stub, size);
                it->second = stub_target(stub, size) != 0;
                break;
            } catch (const Error&) {
            }
    }
    return it->second;
}

std::vector<SiteText> read_sites(const ProcessMemory& memory, const std::vector<std::uint64_t>& addresses) {
    std::vector<std::size_t> order(addresses.size());
    for (std::size_t i = 0; i < order.size(); i++) order[i] = i;
    std::sort(order.begin(), order.end(), [&](auto a, auto b) { return addresses[a] < addresses[b]; });
    std::vector<SiteText> out(addresses.size());
    std::vector<std::uint8_t> run;
    for (std::size_t i = 0; i < order.size();) {
        const std::uint64_t low = addresses[order[i]];
        std::uint64_t high = low + IPROBE_PL_SITE_MAX;
        std::size_t j = i + 1;
        while (j < order.size() && addresses[order[j]] < high + kPage) high = addresses[order[j++]] + IPROBE_PL_SITE_MAX;
        run.resize(high - low);
        memory.read(low, run.data(), run.size());
        for (std::size_t k = i; k < j; k++)
            std::memcpy(out[order[k]].data(), run.data() + (addresses[order[k]] - low), IPROBE_PL_SITE_MAX);
        i = j;
    }
    return out;
}

}  // namespace iprobe::hotpatch
