#include "binary_checks.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <regex>
#include <set>
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

std::map<std::string, std::uint64_t> padded_functions(const std::string& binary) {
    std::map<std::string, std::uint64_t> padded;
    std::istringstream lines(objdump(binary));
    std::string line, function;
    std::uint64_t pad = 0;
    int nops = 0;
    static const std::regex function_re(R"(^[0-9a-f]+ <(.+)>:$)");
    static const std::regex insn_re(R"(^\s*([0-9a-f]+):\s+(\S+)\s*(.*)$)");
    std::smatch m;
    while (std::getline(lines, line)) {
        if (std::regex_match(line, m, function_re)) {
            function = m[1];
            nops = 0;
            continue;
        }
        if (function.empty() || !std::regex_match(line, m, insn_re)) continue;
        const std::string mnemonic = m[2], operands = m[3];
        const std::uint64_t address = std::stoull(m[1], nullptr, 16);
        if (mnemonic == "endbr64" && nops == 0) continue;
        if (mnemonic == "nopl" && operands.ends_with("(%rax,%rax,1)") && nops == 0) {
            padded[function] = address;
        } else if (mnemonic == "nop" && operands.empty()) {
            if (nops++ == 0) pad = address;
            if (nops < 5) continue;
            padded[function] = pad;
        }
        function.clear();
    }
    return padded;
}

void expect_an_entry_probe_per_padded_function(const std::string& binary, const probelist::ProbeList& list) {
    std::set<std::uint64_t> padded, entries;
    for (const auto& [name, pad] : padded_functions(binary)) padded.insert(pad);
    std::size_t relocated = 0;  // small leaves left without a pad (the gcc plugin's threshold)
    for (const auto& p : list.probes)
        if (p.kind == probelist::ProbeKind::entry) p.relocated ? void(++relocated) : void(entries.insert(p.site));
    EXPECT_EQ(entries, padded) << binary << ": an entry probe per function starting with a pad";
    EXPECT_EQ(list.probes.size(), 2 * (entries.size() + relocated)) << binary << ": an entry and an exit per function";
}

void compile(const std::string& dir, const std::string& command_line) {
    const auto r = sh("cd '" + dir + "' && " + command_line, std::chrono::seconds(300));
    ASSERT_EQ(r.exit_code, 0) << command_line << "\n" << r.out << r.err;
}

namespace {

// The unqualified name of a function, without template arguments or
// parameters: DWARF names inlined C++ functions briefly ("Circle",
// "summarize<...>"), symbols fully ("geometry::Circle::Circle(double)").
std::string simple_name(const std::string& name) {
    std::string last, current;
    int depth = 0;
    for (std::size_t i = 0; i < name.size(); ++i) {
        const char c = name[i];
        if (c == '<' || c == '(' || c == '[' || c == '{') {
            if (depth == 0 && name.compare(i, 2, "()") == 0 && current == "operator") {
                current += "()";
                ++i;
                continue;
            }
            ++depth;
        } else if (c == '>' || c == ')' || c == ']' || c == '}') {
            --depth;
        } else if (depth == 0 && c == ':' ) {
            if (!current.empty()) last = current;
            current.clear();
        } else if (depth == 0 && c == ' ') {
            current.clear();  // return type ("auto f") or qualifiers
        } else if (depth == 0) {
            current += c;
        }
    }
    return current.empty() ? last : current;
}

}  // namespace

std::vector<std::string> probes_misnamed(const std::string& binary, const probelist::ProbeList& list) {
    std::string addresses;
    std::vector<const probelist::Probe*> located;
    for (const auto& p : list.probes) {
        if (p.file.empty()) continue;
        located.push_back(&p);
        char buf[32];
        std::snprintf(buf, sizeof buf, "0x%llx\n", static_cast<unsigned long long>(p.site));
        addresses += buf;
    }
    const auto r = run({"addr2line", "-a", "-i", "-f", "-C", "-e", binary}, addresses, std::chrono::seconds(300));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    // Output per address: "0x<16 hex>" then (function, file:line) pairs.
    std::vector<std::vector<std::string>> chains;
    std::istringstream lines(r.out);
    std::string line;
    bool function_line = false;
    while (std::getline(lines, line)) {
        if (line.size() == 18 && line.rfind("0x", 0) == 0) {
            chains.emplace_back();
            function_line = true;
            continue;
        }
        if (function_line && !chains.empty())
            chains.back().push_back(line.substr(0, std::min(line.find(".cold"), line.find(" [clone"))));
        function_line = !function_line;
    }
    std::vector<std::string> wrong;
    for (std::size_t i = 0; i < located.size() && i < chains.size(); ++i) {
        const auto& chain = chains[i];
        if (std::find(chain.begin(), chain.end(), located[i]->function) != chain.end()) continue;
        const std::string wanted = simple_name(located[i]->demangled);
        if (std::any_of(chain.begin(), chain.end(), [&](const std::string& f) { return simple_name(f) == wanted; }))
            continue;
        std::string text = std::to_string(located[i]->site) + " " + located[i]->demangled + " (" + wanted + ") not in [";
        for (const auto& f : chain) text += f + " | ";
        wrong.push_back(text + "]");
    }
    EXPECT_EQ(chains.size(), located.size());
    return wrong;
}

std::string hook_recorder() {
    static TempDir dir;  // built once per test program, removed at its exit
    const std::string so = dir / "hook_recorder.so";
    if (!file_bytes(so).empty()) return so;
    const auto r = run({"gcc", "-O2", "-shared", "-fPIC", "-o", so,
                        source_dir() + "/tests/coldpatch/data/hook_recorder.c"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return so;
}

std::vector<std::string> recorder_env(const std::string& log_path) {
    return {"LD_PRELOAD=" + hook_recorder(), "IPROBE_HOOK_LOG=" + log_path};
}

RecordedCheck check_recorded(const std::string& log_path, const probelist::ProbeList& list) {
    std::map<std::uint64_t, const probelist::Probe*> by_return;
    for (const auto& p : list.probes) by_return[p.site + p.size] = &p;
    RecordedCheck check;
    std::istringstream lines(file_text(log_path));
    char kind = 0;
    std::string ret_hex, fn_hex;
    while (lines >> kind >> ret_hex >> fn_hex) {
        ++check.sites;
        const auto ret = std::stoull(ret_hex, nullptr, 16), fn = std::stoull(fn_hex, nullptr, 16);
        const auto it = by_return.find(ret);
        if (it == by_return.end()) {
            check.problems.push_back("hook called from " + ret_hex + " where no probe is listed");
            continue;
        }
        const probelist::Probe& p = *it->second;
        if ((kind == 'E') != (p.kind == probelist::ProbeKind::entry))
            check.problems.push_back("probe " + std::to_string(p.id) + " (" + p.demangled + ") has the wrong kind");
        if (p.function_address != fn) {
            check.misnamed.push_back("probe " + std::to_string(p.id) + " names " + p.demangled +
                                     " but the hook received this_fn 0x" + fn_hex);
            if (!p.shared_site) check.misnamed_unflagged.push_back(check.misnamed.back());
        }
    }
    return check;
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

void expect_only_sites_changed(const std::string& unpatched, const std::string& patched, const probelist::ProbeList& list) {
    const auto before = file_bytes(unpatched);
    const auto after = file_bytes(patched);
    ASSERT_EQ(before.size(), after.size());
    std::vector<bool> in_site(before.size(), false);
    const auto insns = disassembly(patched);
    for (const auto& p : list.probes) {
        if (p.original == p.placeholder) continue;  // emitted as its placeholder (marked points)
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
