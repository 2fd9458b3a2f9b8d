// The entry-NOP flow (iprobe-cc --flow=entry): gcc's five 1-byte NOPs per
// out-of-line function become one 5-byte NOP, the function's entry probe and
// its exit probe (form `return`, served by that same site); inlined copies
// carry nothing.  Checked against binutils' view of the binary.
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>

#include "binary_checks.h"
#include "iprobe/probelist/probe_list.h"
#include "testutil.h"

namespace iprobe::test {
namespace {

constexpr char kCProgram[] = R"(#include <stdio.h>
static inline int twice(int x) { return 2 * x; }           /* always inlined: no site */
__attribute__((noinline)) static int leaf(int x) { return twice(x) + 1; }
__attribute__((noinline)) int middle(int x) { return leaf(x) * leaf(x + 1); }
int main(int argc, char** argv) {
    (void)argv;
    long sum = 0;
    for (int i = 0; i < 1000; i++) sum += middle(i + argc);
    printf("%ld\n", sum);
    return 0;
}
)";

constexpr char kCxxProgram[] = R"(#include <cstdio>
#include <stdexcept>
#include <string>
template <typename T> __attribute__((noinline)) T square(T x) { return x * x; }
struct Shape { virtual ~Shape() = default; virtual double area() const = 0; };
struct Box : Shape { double w, h; Box(double a, double b) : w(a), h(b) {}
    double area() const override { return w * h; } };
__attribute__((noinline)) int may_throw(int i) { if (i == 7) throw std::runtime_error("seven"); return i; }
int main() {
    long sum = 0;
    for (int i = 0; i < 10; i++) {
        try { sum += may_throw(i); } catch (const std::exception& e) { sum += 100 * std::string(e.what()).size(); }
    }
    Box b(3, 4);
    const Shape& s = b;
    std::printf("%ld %d %.1f %.1f\n", sum, square(5), square(1.5), s.area());
    return 0;
}
)";

class EntryFlow : public ::testing::Test {
protected:
    void SetUp() override {
        std::ofstream(dir_ / "prog.c") << kCProgram;
        std::ofstream(dir_ / "prog.cc") << kCxxProgram;
    }
    CommandResult in_dir(const std::string& command) { return sh("cd '" + dir_.path() + "' && " + command); }
    // Builds `source` natively and with the entry flow (raw and coldpatched);
    // all three must print the same.
    probelist::ProbeList build(const std::string& source, const std::string& compiler, const std::string& tool,
                    const std::string& flags) {
        compile(dir_.path(), compiler + " " + flags + " " + source + " -o native");
        compile(dir_.path(), "IPROBE_COLDPATCH=0 " + bin(tool) + " --flow=entry " + flags + " " + source + " -o raw");
        compile(dir_.path(), bin(tool) + " --flow=entry " + flags + " " + source + " -o app");
        const auto native = run({dir_ / "native"});
        EXPECT_EQ(native.exit_code, 0);
        EXPECT_EQ(run({dir_ / "raw"}).out, native.out);
        EXPECT_EQ(run({dir_ / "app"}).out, native.out);
        probelist::ProbeList list = probelist::ProbeList::load(dir_ / "app.probes");
        // the same coldpatch, run by hand on the raw link: only the pads change
        const auto patched = run({bin("iprobe"), "coldpatch", dir_ / "raw", "-o", dir_ / "patched"});
        EXPECT_EQ(patched.exit_code, 0) << patched.err;
        const probelist::ProbeList by_hand = probelist::ProbeList::load(dir_ / "patched.probes");
        EXPECT_EQ(by_hand.probes.size(), list.probes.size());
        for (std::size_t i = 0; i < list.probes.size(); i++) {
            const auto& p = list.probes[i];
            if (p.kind == probelist::ProbeKind::entry) {
                EXPECT_TRUE(probelist::serves_returns(list.probes, i)) << p.function << ": no exit after the entry";
            } else {
                EXPECT_EQ(p.kind, probelist::ProbeKind::exit) << p.function;
                EXPECT_EQ(p.form, probelist::SiteForm::ret) << p.function;
            }
        }
        expect_only_sites_changed(dir_ / "raw", dir_ / "patched", by_hand);
        EXPECT_EQ(run({dir_ / "patched"}).out, native.out);
        return list;
    }
    TempDir dir_;
};

TEST_F(EntryFlow, OneEntryNopPerOutOfLineCFunction) {
    const probelist::ProbeList list = build("prog.c", "gcc", "iprobe-cc", "-O2 -g");
    EXPECT_EQ(list.flow, static_cast<std::uint32_t>(IPROBE_FLOW_PATCHABLE_ENTRY));
    std::set<std::string> names;
    for (const auto& p : list.probes) {
        EXPECT_EQ(p.form, p.kind == probelist::ProbeKind::entry ? probelist::SiteForm::nop : probelist::SiteForm::ret);
        EXPECT_EQ(p.site, p.function_address) << p.function << ": the site is the function's first instruction";
        EXPECT_FALSE(p.file.empty()) << p.function;
        names.insert(p.function);
    }
    EXPECT_EQ(names, (std::set<std::string>{"main", "middle", "leaf"}));
    expect_an_entry_probe_per_padded_function(dir_ / "app", list);
    // one instruction per call: objdump sees a single nopl where gcc put five nops
    const auto code = disassembly(dir_ / "app");
    for (const auto& p : list.probes) {
        if (list.probes[p.kind == probelist::ProbeKind::exit ? p.id - 1 : p.id].relocated) continue;  // no pad: leaf
        EXPECT_EQ(code.at(p.site).rfind("nop", 0), 0u) << code.at(p.site);
        EXPECT_EQ(code.count(p.site + 1), 0u) << p.function;
    }
}

TEST_F(EntryFlow, CxxTemplatesVirtualsAndExceptions) {
    const probelist::ProbeList list = build("prog.cc", "g++", "iprobe-c++", "-O2 -g");
    std::set<std::string> names;
    for (const auto& p : list.probes) names.insert(p.demangled);
    for (const char* wanted : {"main", "may_throw(int)", "int square<int>(int)", "double square<double>(double)",
                               "Box::area() const"})
        EXPECT_EQ(names.count(wanted), 1u) << wanted;
    expect_an_entry_probe_per_padded_function(dir_ / "app", list);
}

TEST_F(EntryFlow, SharedLibraryAndIdempotentColdpatch) {
    compile(dir_.path(), bin("iprobe-cc") + " --flow=entry -O2 -fPIC -shared prog.c -o libprog.so");
    const probelist::ProbeList lib = probelist::ProbeList::load(dir_ / "libprog.so.probes");
    EXPECT_NE(lib.flags & IPROBE_PL_FLAG_SHARED, 0u);
    expect_an_entry_probe_per_padded_function(dir_ / "libprog.so", lib);
    const auto before = file_bytes(dir_ / "libprog.so");
    const auto again = run({bin("iprobe"), "coldpatch", dir_ / "libprog.so"});
    EXPECT_EQ(again.exit_code, 0) << again.err;
    EXPECT_NE(again.out.find("already coldpatched"), std::string::npos) << again.out << again.err;
    EXPECT_EQ(file_bytes(dir_ / "libprog.so"), before);
}

TEST_F(EntryFlow, UnknownFlowIsAUsageError) {
    const auto r = in_dir(bin("iprobe-cc") + " --flow=bogus prog.c -o x");
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find("expected finstrument, entry or llvm"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace iprobe::test
