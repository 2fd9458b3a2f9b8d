// iprobe_elf (elf::ElfFile) against binutils' view of the same files.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <sstream>

#include "iprobe/elf/elf_file.h"
#include "iprobe/elf/demangle.h"
#include "iprobe/elf/function_signature.h"
#include "iprobe/elf/function_values.h"
#include "iprobe/support/error.h"
#include "testutil.h"

namespace iprobe::test {
namespace {

constexpr char kProgram[] = R"(#include <stdio.h>
#include <stdlib.h>
__attribute__((noinline)) int twice(int x) { return 2 * x; }
int main(int argc, char **argv) { printf("%d\n", twice(argc)); return argv[1] ? atoi(argv[1]) : 0; }
)";

class ElfFileTest : public ::testing::Test {
protected:
    void SetUp() override {
        std::ofstream(dir_ / "prog.c") << kProgram;
        build("pie", "-O2");
        build("nopie", "-O2 -no-pie");
        build("noplt", "-O2 -fno-plt");
        build("ibt", "-O2 -fcf-protection=full");
        build("lib.so", "-O2 -fPIC -shared -Wl,-soname,libprog.so.1");
    }
    void build(const std::string& out, const std::string& flags) {
        const auto r = sh("cd '" + dir_.path() + "' && gcc " + flags + " prog.c -o " + out);
        ASSERT_EQ(r.exit_code, 0) << r.err;
    }
    TempDir dir_;
};

// name@plt -> address, from objdump.
std::map<std::string, std::uint64_t> plt_by_objdump(const std::string& path) {
    std::map<std::string, std::uint64_t> out;
    const auto r = run({"objdump", "-d", path});
    static const std::regex re(R"(^([0-9a-f]+) <([^@>]+)@plt>:)");
    std::istringstream lines(r.out);
    std::string line;
    std::smatch m;
    while (std::getline(lines, line))
        if (std::regex_search(line, m, re)) out[m[2]] = std::stoull(m[1], nullptr, 16);
    return out;
}

// symbol -> GOT slot, from readelf -r.
std::map<std::string, std::uint64_t> slots_by_readelf(const std::string& path) {
    std::map<std::string, std::uint64_t> out;
    const auto r = run({"readelf", "-rW", path});
    static const std::regex re(R"(^([0-9a-f]+)\s+[0-9a-f]+\s+R_X86_64_(JUMP_SLOT|GLOB_DAT)\s+[0-9a-f]+\s+([^@\s]+))");
    std::istringstream lines(r.out);
    std::string line;
    std::smatch m;
    while (std::getline(lines, line))
        if (std::regex_search(line, m, re)) out[m[3]] = std::stoull(m[1], nullptr, 16);
    return out;
}

TEST_F(ElfFileTest, BuildIdMatchesReadelf) {
    const auto r = run({"readelf", "-n", dir_ / "pie"});
    std::smatch m;
    ASSERT_TRUE(std::regex_search(r.out, m, std::regex("Build ID: ([0-9a-f]+)")));
    const elf::ElfFile elf(dir_ / "pie");
    EXPECT_EQ(elf.build_id_hex(), m[1].str());
    EXPECT_EQ(elf.build_id().size() * 2, m[1].str().size());
}

TEST_F(ElfFileTest, TypesAndFlags) {
    const elf::ElfFile pie(dir_ / "pie"), nopie(dir_ / "nopie"), lib(dir_ / "lib.so");
    EXPECT_TRUE(pie.is_x86_64());
    EXPECT_TRUE(pie.is_position_independent());
    EXPECT_FALSE(pie.is_shared_library());
    EXPECT_FALSE(nopie.is_position_independent());
    EXPECT_FALSE(nopie.is_shared_library());
    EXPECT_TRUE(lib.is_shared_library());
    EXPECT_EQ(lib.soname(), "libprog.so.1");
    EXPECT_EQ(pie.soname(), "");
    EXPECT_EQ(pie.first_load_vaddr(), 0u);
    EXPECT_EQ(nopie.first_load_vaddr(), 0x400000u);
    EXPECT_FALSE(pie.load_segments().empty());
    const auto text = pie.section(".text");
    ASSERT_NE(text, nullptr);
    EXPECT_TRUE(text->executable());
    EXPECT_EQ(pie.file_offset(text->address), text->offset);
    EXPECT_EQ(pie.section_bytes(*text).size(), text->size);
    EXPECT_EQ(pie.section(".no-such-section"), nullptr);
}

TEST_F(ElfFileTest, SymbolsByNameAndAddress) {
    const elf::ElfFile elf(dir_ / "pie");
    const auto* twice = elf.symbol_named("twice");
    ASSERT_NE(twice, nullptr);
    EXPECT_TRUE(twice->is_function());
    EXPECT_EQ(elf.function_at(twice->address), twice);
    EXPECT_EQ(elf.function_at(twice->address + 1), twice);
    EXPECT_EQ(elf.function_starting_at(twice->address), twice);
    EXPECT_EQ(elf.function_starting_at(twice->address + 1), nullptr);
    const auto nm = run({"nm", dir_ / "pie"});
    std::smatch m;
    ASSERT_TRUE(std::regex_search(nm.out, m, std::regex("([0-9a-f]+) T twice")));
    EXPECT_EQ(twice->address, std::stoull(m[1], nullptr, 16));
    // Dynamic symbols are there too, also in a stripped copy.
    ASSERT_EQ(sh("cd '" + dir_.path() + "' && strip -o lib.stripped lib.so").exit_code, 0);
    const elf::ElfFile stripped(dir_ / "lib.stripped");
    const auto* exported = stripped.symbol_named("twice");
    ASSERT_NE(exported, nullptr);
    EXPECT_TRUE(exported->dynamic);
    EXPECT_EQ(stripped.function_at(exported->address + 2), exported);
    EXPECT_EQ(stripped.section(".symtab"), nullptr);
}

TEST_F(ElfFileTest, PltAndGotAgreeWithBinutils) {
    for (const char* f : {"pie", "nopie", "ibt", "lib.so"}) {
        SCOPED_TRACE(f);
        const elf::ElfFile elf(dir_ / f);
        const auto plt = plt_by_objdump(dir_ / f);
        const auto slots = slots_by_readelf(dir_ / f);
        ASSERT_FALSE(plt.empty());
        for (const auto& [name, address] : plt) {
            const elf::PltEntry* e = elf.plt_entry_at(address);
            ASSERT_NE(e, nullptr) << name << "@plt";
            EXPECT_EQ(e->symbol, name);
            ASSERT_TRUE(slots.count(name));
            EXPECT_EQ(e->got_slot, slots.at(name));
        }
        for (const auto& [name, slot] : slots) {
            const elf::GotSlot* g = elf.got_slot_at(slot);
            ASSERT_NE(g, nullptr) << name;
            EXPECT_EQ(g->symbol, name);
        }
    }
    const elf::ElfFile noplt(dir_ / "noplt");
    const auto slots = slots_by_readelf(dir_ / "noplt");
    ASSERT_TRUE(slots.count("printf"));
    EXPECT_EQ(noplt.got_slot_at(slots.at("printf"))->reloc_type, 6u) << "R_X86_64_GLOB_DAT";
}

TEST_F(ElfFileTest, RefusesWhatIsNotElf) {
    std::ofstream(dir_ / "text") << "hello\n";
    try {
        elf::ElfFile bad(dir_ / "text");
        FAIL() << "accepted a text file";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ExitCode::bad_input);
        EXPECT_NE(std::string(e.what()).find("not an ELF file"), std::string::npos);
    }
    try {
        elf::ElfFile missing(dir_ / "missing");
        FAIL() << "opened a missing file";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ExitCode::not_found);
    }
    auto bytes = file_bytes(dir_ / "pie");
    bytes[18] = 183;  // EM_AARCH64
    const elf::ElfFile arm(bytes, "arm");
    EXPECT_FALSE(arm.is_x86_64());
    EXPECT_THROW(arm.require_x86_64_executable_or_library(), Error);
}

TEST(Demangle, CxxAndC) {
    EXPECT_EQ(elf::demangle("_ZNK2ns3BoxIiE3getEv"), "ns::Box<int>::get() const");
    EXPECT_EQ(elf::demangle("main"), "main");
    EXPECT_EQ(elf::demangle("_Znot_valid"), "_Znot_valid");
}

// Rust's standard library comes with v0 names, programs often with legacy
// ones (whose hash the C++ demangler kept as a name).
TEST(Demangle, RustV0AndLegacy) {
    EXPECT_EQ(elf::demangle("_RNvNtCsjrHSEGnQ3l9_3std9panicking15panic_with_hook"), "std::panicking::panic_with_hook");
    EXPECT_EQ(elf::demangle("_RINvNtNtCsjrHSEGnQ3l9_3std3sys9backtrace26___rust_end_short_backtraceNCNvNtB6_"
                            "9panicking13panic_handler0zEB6_"),
              "std::sys::backtrace::__rust_end_short_backtrace::<std::panicking::panic_handler::{closure#0}, !>");
    EXPECT_EQ(elf::demangle("_ZN4main9may_panic17h8dca00fe6b58389bE"), "main::may_panic");
    EXPECT_EQ(elf::demangle("_ZNSt6vectorIiSaIiEE9push_backERKi"), "std::vector<int, std::allocator<int> >::push_back(int const&)");
    EXPECT_EQ(elf::demangle("_Rnot_valid"), "_Rnot_valid");
}

// A program whose DWARF covers one of its two units (node's shape: most
// functions without it): the file's DWARF is opened and indexed once, and
// kept; each function is found in it by its entry, or is not there.
TEST(ElfDwarf, FunctionsAreFoundInTheOneIndexOfTheFilesDwarf) {
    TempDir dir;
    std::ofstream(dir / "typed.c") << "__attribute__((noinline)) int twice(int x, const char* why) { return 2 * x + !why; }\n";
    std::ofstream(dir / "main.c") << R"(#include <stdio.h>
int twice(int x, const char* why);
__attribute__((noinline)) int thrice(int x) { return 3 * x; }
int main(int argc, char** argv) { printf("%d\n", twice(argc, argv[0]) + thrice(argc)); return 0; }
)";
    const auto r = sh("cd '" + dir.path() + "' && gcc -O2 -g -c typed.c && gcc -O2 -c main.c && gcc typed.o main.o -o mixed" +
                      " && gcc -O2 typed.c main.c -o plain");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const elf::ElfFile mixed(dir / "mixed");
    ASSERT_NE(mixed.function_dies(), nullptr);
    EXPECT_EQ(mixed.function_dies(), mixed.function_dies());  // kept, not read again
    const elf::ElfSymbol* twice = mixed.symbol_named("twice");
    const elf::ElfSymbol* thrice = mixed.symbol_named("thrice");
    ASSERT_TRUE(twice && thrice);
    const auto values = elf::function_values(mixed, twice->address, "twice");
    ASSERT_TRUE(values.has_value());
    ASSERT_EQ(values->params.size(), 2u);
    EXPECT_EQ(values->params[0].name, "x");
    EXPECT_EQ(values->params[0].type.name, "int");
    EXPECT_EQ(values->params[1].name, "why");
    EXPECT_EQ(values->params[1].type.name, "const char*");
    EXPECT_EQ(values->gprs, 2);
    EXPECT_EQ(values->strings, 2);  // rsi
    EXPECT_EQ(elf::function_signature(mixed, twice->address), "int(int, const char*)");
    EXPECT_FALSE(elf::function_values(mixed, thrice->address, "thrice").has_value());
    EXPECT_FALSE(elf::function_signature(mixed, thrice->address).has_value());
    EXPECT_FALSE(elf::function_values(mixed, twice->address + 1, "twice").has_value());  // not an entry

    const elf::ElfFile plain(dir / "plain");
    EXPECT_EQ(plain.function_dies(), nullptr);
    EXPECT_FALSE(elf::function_values(plain, plain.symbol_named("twice")->address, "twice").has_value());
}

}  // namespace
}  // namespace iprobe::test
