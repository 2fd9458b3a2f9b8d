// Programs that link with plain g++ link with iprobe-c++ in every flow, and
// every out-of-line function they keep is a probe (issue 25): C++ whose
// inline functions (COMDAT groups) are defined in two translation units, a
// static library, a shared library, -ffunction-sections with --gc-sections,
// -flto, -static.  Each case asserts the exact set of probed functions, that
// the program runs, and (entry and LLVM flows) that the set of entry sites is
// binutils' set of functions starting with a pad.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "binary_checks.h"
#include "iprobe/probelist/probe_list.h"
#include "iprobe/probelist/site_section.h"
#include "testutil.h"

namespace iprobe::test {
namespace {

// The issue's two files: W's constructor and destructors are emitted in both
// (COMDAT groups), the linker keeps one copy of each.
constexpr char kX[] = R"(#include <string>
int first() { return 1; }
struct W { std::string s; virtual ~W() {} };
W* mk1() { return new W; }
)";
constexpr char kY[] = R"(#include <string>
int second() { return 2; }
struct W { std::string s; virtual ~W() {} };
W* mk1();
int main() { W* a = mk1(); W* b = new W; delete a; delete b; return second() - 2; }
)";

using Names = std::multiset<std::string>;

// W's out-of-line members at -O0: the constructor (C1 = C2), the complete
// destructor (D1 = D2) and the deleting one (D0).
const Names kW{"W::W()", "W::~W()", "W::~W()"};

Names with_w(Names names) {
    names.insert(kW.begin(), kW.end());
    return names;
}

class Link : public ::testing::TestWithParam<const char*> {
protected:
    void SetUp() override {
        std::ofstream(dir_ / "x.cpp") << kX;
        std::ofstream(dir_ / "y.cpp") << kY;
    }
    std::string cxx() const { return bin("iprobe-c++") + " --flow=" + GetParam(); }
    std::string flow() const { return GetParam(); }
    bool llvm_unavailable() const {
        return flow() == "llvm" && !exists(build_dir() + "/lib/IProbePass.so");
    }
    static bool exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

    // The functions `binary`'s probe list has an entry probe for, demangled.
    Names probed(const std::string& binary) {
        // The LLVM flow's list is in the binary itself, the others' beside it.
        const probelist::ProbeList list = flow() == "llvm" ? probelist::read_site_section(binary).value()
                                                           : probelist::ProbeList::load(binary + ".probes");
        if (flow() != "finstrument") expect_an_entry_probe_per_padded_function(binary, list);
        Names names;
        for (const auto& p : list.probes)
            if (p.kind == probelist::ProbeKind::entry) names.insert(p.demangled);
        return names;
    }
    void expect_runs(const std::string& binary, const std::vector<std::string>& env = {}) {
        const auto r = run({binary}, {}, std::chrono::seconds(30), env);
        EXPECT_EQ(r.exit_code, 0) << binary << ": " << r.err;
    }
    TempDir dir_;
};

TEST_P(Link, TwoFilesWithTheSameInlineFunctions) {
    if (llvm_unavailable()) GTEST_SKIP() << "IProbePass.so not built (no clang-14)";
    compile(dir_.path(), cxx() + " -O0 x.cpp y.cpp -o xy");
    expect_runs(dir_ / "xy");
    EXPECT_EQ(probed(dir_ / "xy"), with_w({"first()", "second()", "mk1()", "main"}));
}

TEST_P(Link, StaticLibrary) {
    if (llvm_unavailable()) GTEST_SKIP() << "IProbePass.so not built (no clang-14)";
    compile(dir_.path(), cxx() + " -O0 -c x.cpp -o x.o && ar rcs libx.a x.o && " + cxx() +
                             " -O0 y.cpp libx.a -o xy");
    expect_runs(dir_ / "xy");
    EXPECT_EQ(probed(dir_ / "xy"), with_w({"first()", "second()", "mk1()", "main"}));
}

TEST_P(Link, SharedLibraryAndItsUser) {
    if (llvm_unavailable()) GTEST_SKIP() << "IProbePass.so not built (no clang-14)";
    compile(dir_.path(), cxx() + " -O0 -fPIC -shared x.cpp -o libx.so && " + cxx() +
                             " -O0 y.cpp -L. -lx -o xy");
    expect_runs(dir_ / "xy", {"LD_LIBRARY_PATH=" + dir_.path()});
    EXPECT_EQ(probed(dir_ / "libx.so"), with_w({"first()", "mk1()"}));
    EXPECT_EQ(probed(dir_ / "xy"), with_w({"second()", "main"}));
}

TEST_P(Link, FunctionSectionsCollected) {
    if (llvm_unavailable()) GTEST_SKIP() << "IProbePass.so not built (no clang-14)";
    compile(dir_.path(), cxx() + " -O0 -ffunction-sections -Wl,--gc-sections x.cpp y.cpp -o xy");
    expect_runs(dir_ / "xy");
    // first() is never called: collected, and so not a probe.  The LLVM
    // flow's site records (iprobe_sites, SHF_GNU_RETAIN) still keep it.
    if (flow() == "llvm")
        EXPECT_EQ(probed(dir_ / "xy"), with_w({"first()", "second()", "mk1()", "main"}));
    else
        EXPECT_EQ(probed(dir_ / "xy"), with_w({"second()", "mk1()", "main"}));
}

TEST_P(Link, LinkTimeOptimisation) {
    if (llvm_unavailable()) GTEST_SKIP() << "IProbePass.so not built (no clang-14)";
    compile(dir_.path(), cxx() + " -O0 -flto x.cpp y.cpp -o xy");
    expect_runs(dir_ / "xy");
    EXPECT_EQ(probed(dir_ / "xy"), with_w({"first()", "second()", "mk1()", "main"}));
}

TEST_P(Link, StaticExecutable) {
    if (llvm_unavailable()) GTEST_SKIP() << "IProbePass.so not built (no clang-14)";
    compile(dir_.path(), cxx() + " -O0 -static x.cpp y.cpp -o xy");
    expect_runs(dir_ / "xy");
    EXPECT_EQ(probed(dir_ / "xy"), with_w({"first()", "second()", "mk1()", "main"}));
}

INSTANTIATE_TEST_SUITE_P(Flows, Link, ::testing::Values("entry", "finstrument", "llvm"),
                         [](const auto& info) { return std::string(info.param); });

// A padded function the probe list cannot name is said, never dropped: a
// link with -s keeps no symbols, iprobe-cc warns with the count.
TEST(LinkStripped, PaddedFunctionsWithoutSymbolsAreReported) {
    TempDir dir;
    std::ofstream(dir / "x.cpp") << kX;
    std::ofstream(dir / "y.cpp") << kY;
    const auto r = sh("cd '" + dir.path() + "' && IPROBE_CC_VERBOSE=1 " + bin("iprobe-c++") +
                      " -O0 -s x.cpp y.cpp -o xy");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("have a pad but no symbol"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace iprobe::test
