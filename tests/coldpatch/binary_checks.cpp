#include "binary_checks.h"

#include <gtest/gtest.h>

#include <regex>
#include <sstream>

#include "testutil.h"

namespace iprobe::test {

namespace {

bool is_plt_section(const std::string& name) { return name == ".plt" || name == ".plt.sec" || name == ".plt.got"; }

std::string objdump(const std::string& binary) {
    const auto r = run({"objdump", "-d", "-w", "--no-show-raw-insn", binary}, {}, std::chrono::seconds(300));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.out;
}

}  // namespace

HookCalls count_hook_calls(const std::string& binary) {
    HookCalls calls;
    std::istringstream lines(objdump(binary));
    std::string line, section;
    static const std::regex section_re(R"(^Disassembly of section (\S+):)");
    static const std::regex insn_re(R"(^\s*[0-9a-f]+:\s+(call|jmp)\s.*<__cyg_profile_func_(enter|exit))");
    std::smatch m;
    while (std::getline(lines, line)) {
        if (std::regex_search(line, m, section_re)) {
            section = m[1];
            continue;
        }
        if (is_plt_section(section) || line.find("__cyg_profile_func_") == std::string::npos) continue;
        if (!std::regex_search(line, m, insn_re)) continue;
        if (m[1] == "jmp") {
            ++calls.tail_jumps;
        } else if (m[2] == "enter") {
            ++calls.enter;
        } else {
            ++calls.exit;
        }
    }
    return calls;
}

std::map<std::uint64_t, std::string> disassembly(const std::string& binary) {
    std::map<std::uint64_t, std::string> out;
    std::istringstream lines(objdump(binary));
    std::string line;
    static const std::regex insn_re(R"(^\s*([0-9a-f]+):\s+(\S.*)$)");
    std::smatch m;
    while (std::getline(lines, line))
        if (std::regex_match(line, m, insn_re)) out[std::stoull(m[1], nullptr, 16)] = m[2];
    return out;
}

void compile(const std::string& dir, const std::string& command_line) {
    const auto r = sh("cd '" + dir + "' && " + command_line, std::chrono::seconds(300));
    ASSERT_EQ(r.exit_code, 0) << command_line << "\n" << r.out << r.err;
}

std::uint64_t file_offset_of(const std::string& binary, std::uint64_t vaddr) {
    const auto r = run({"readelf", "-lW", binary});
    std::istringstream lines(r.out);
    std::string line;
    static const std::regex load_re(R"(^\s*LOAD\s+0x([0-9a-f]+)\s+0x([0-9a-f]+)\s+0x[0-9a-f]+\s+0x([0-9a-f]+))");
    std::smatch m;
    while (std::getline(lines, line)) {
        if (!std::regex_search(line, m, load_re)) continue;
        const auto offset = std::stoull(m[1], nullptr, 16), va = std::stoull(m[2], nullptr, 16),
                   filesz = std::stoull(m[3], nullptr, 16);
        if (vaddr >= va && vaddr < va + filesz) return offset + (vaddr - va);
    }
    ADD_FAILURE() << "no PT_LOAD holds " << vaddr << " in " << binary;
    return 0;
}

void expect_only_sites_changed(const std::string& unpatched, const std::string& patched, const ProbeList& list) {
    const auto before = file_bytes(unpatched);
    const auto after = file_bytes(patched);
    ASSERT_EQ(before.size(), after.size());
    std::vector<bool> in_site(before.size(), false);
    const auto insns = disassembly(patched);
    for (const auto& p : list.probes) {
        if (p.form == SiteForm::nop) continue;
        const auto off = file_offset_of(patched, p.site);
        ASSERT_LE(off + p.size, before.size());
        for (unsigned i = 0; i < p.size; ++i) {
            in_site[off + i] = true;
            EXPECT_EQ(before[off + i], p.original[i]) << "original byte " << i << " of site " << std::hex << p.site;
            EXPECT_EQ(after[off + i], p.placeholder[i]) << "placeholder byte " << i << " of site " << std::hex << p.site;
        }
        const auto it = insns.find(p.site);
        ASSERT_NE(it, insns.end()) << "objdump has no instruction at site " << std::hex << p.site;
        EXPECT_EQ(it->second.rfind("nop", 0), 0u) << "site " << std::hex << p.site << " decodes as " << it->second;
        const auto next = std::next(it);
        if (next != insns.end()) {
            EXPECT_EQ(next->first, p.site + p.size) << "the NOP is not one instruction";
        }
    }
    std::size_t outside = 0;
    for (std::size_t i = 0; i < before.size(); ++i)
        if (!in_site[i] && before[i] != after[i]) ++outside;
    EXPECT_EQ(outside, 0u) << "bytes changed outside the probe sites";
}

}  // namespace iprobe::test
