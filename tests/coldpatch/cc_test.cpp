// iprobe-cc / iprobe-c++ as drop-in compilers: transparent where nothing is
// compiled or linked, instrumenting and coldpatching where something is.
#include <sys/stat.h>

#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include "binary_checks.h"
#include "iprobe/probelist/probe_list.h"
#include "testutil.h"

namespace iprobe::test {
namespace {

constexpr char kProgram[] = R"(#include <stdio.h>
#include "helper.h"
int main(void) { printf("%d\n", helper(20)); return 0; }
)";
constexpr char kHelperHeader[] = "int helper(int x);\n";
constexpr char kHelper[] = R"(#include "helper.h"
__attribute__((noinline)) static int plus_one(int x) { return x + 1; }
int helper(int x) { return plus_one(x) * 2; }
)";

bool exists(const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0;
}

class Wrapper : public ::testing::Test {
protected:
    void SetUp() override {
        std::ofstream(dir_ / "main.c") << kProgram;
        std::ofstream(dir_ / "helper.h") << kHelperHeader;
        std::ofstream(dir_ / "helper.c") << kHelper;
    }
    CommandResult in_dir(const std::string& command) { return sh("cd '" + dir_.path() + "' && " + command); }
    std::string cc() const { return bin("iprobe-cc"); }
    TempDir dir_;
};

TEST_F(Wrapper, PreprocessingIsUntouched) {
    for (const std::string flags : {"-E main.c", "-M main.c", "-MM main.c", "-E -dM -x c /dev/null"}) {
        SCOPED_TRACE(flags);
        const auto real = in_dir("gcc " + flags);
        const auto wrapped = in_dir(cc() + " " + flags);
        EXPECT_EQ(real.exit_code, 0);
        EXPECT_EQ(wrapped.exit_code, 0) << wrapped.err;
        EXPECT_EQ(wrapped.out, real.out);
        EXPECT_EQ(wrapped.err, real.err);
    }
}

TEST_F(Wrapper, QueriesAreUntouched) {
    for (const std::string flags : {"--version", "-dumpversion", "-dumpmachine", "-print-prog-name=ld", "--help"}) {
        SCOPED_TRACE(flags);
        const auto real = in_dir("gcc " + flags);
        const auto wrapped = in_dir(cc() + " " + flags);
        EXPECT_EQ(wrapped.exit_code, real.exit_code);
        EXPECT_EQ(wrapped.out, real.out);
    }
    const auto real = in_dir("g++ --version");
    EXPECT_EQ(in_dir(bin("iprobe-c++") + " --version").out, real.out);
    const auto help = in_dir(cc() + " --iprobe-help");
    EXPECT_EQ(help.exit_code, 0);
    EXPECT_NE(help.out.find("usage: iprobe-cc"), std::string::npos);
    EXPECT_NE(help.out.find("IPROBE_CC"), std::string::npos);
}

TEST_F(Wrapper, CompileStepGetsPlaceholdersAndNoProbeList) {
    // the default flow: a patchable entry per function
    auto r = in_dir(cc() + " -O2 -c helper.c -o helper.o");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(in_dir("readelf -SW helper.o").out.find("__patchable_function_entries"), std::string::npos);
    EXPECT_FALSE(exists(dir_ / "helper.o.probes"));
    auto s = in_dir(cc() + " -O2 -S helper.c -o -");
    EXPECT_EQ(s.exit_code, 0);
    EXPECT_NE(s.out.find("__patchable_function_entries"), std::string::npos) << s.out;
    EXPECT_EQ(s.out.find("__cyg_profile_func_enter"), std::string::npos) << s.out;
    // --flow=finstrument: hook calls
    r = in_dir(cc() + " --flow=finstrument -O2 -c helper.c -o helper.o");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto relocs = in_dir("readelf -rW helper.o");
    EXPECT_NE(relocs.out.find("__cyg_profile_func_enter"), std::string::npos);
    EXPECT_NE(relocs.out.find("__cyg_profile_func_exit"), std::string::npos);
    EXPECT_FALSE(exists(dir_ / "helper.o.probes"));
    s = in_dir(cc() + " --flow=finstrument -O2 -S helper.c -o -");
    EXPECT_EQ(s.exit_code, 0);
    EXPECT_NE(s.out.find("call\t__cyg_profile_func_enter"), std::string::npos) << s.out;
}

// The finstrument flow excludes system headers (IPROBE_EXCLUDE).
TEST_F(Wrapper, FinstrumentExcludesSystemHeadersByDefault) {
    std::ofstream(dir_ / "vec.cc") << "#include <vector>\nint main() { std::vector<int> v; v.push_back(1); return v[0] - 1; }\n";
    auto std_probes = [&](const std::string& env) {
        const auto r = in_dir(env + " " + bin("iprobe-c++") + " --flow=finstrument -O0 vec.cc -o vec");
        EXPECT_EQ(r.exit_code, 0) << r.err;
        const probelist::ProbeList list = probelist::ProbeList::load(dir_ / "vec.probes");
        int n = 0;
        for (const auto& p : list.probes) n += p.demangled.find("std::") != std::string::npos;
        EXPECT_GT(list.probes.size(), 0u);
        return n;
    };
    EXPECT_EQ(std_probes(""), 0) << "libstdc++ code from /usr/include is excluded";
    EXPECT_GT(std_probes("IPROBE_EXCLUDE="), 0) << "an empty IPROBE_EXCLUDE instruments it";
    for (const char* flow : {"finstrument", "entry"}) {
        const auto custom = in_dir("IPROBE_CFLAGS='-DNOTHING' " + cc() + " --flow=" + flow + " -O0 -S helper.c -o -");
        EXPECT_EQ(custom.out.find("__cyg_profile_func_enter"), std::string::npos) << "IPROBE_CFLAGS replaces the flags";
        EXPECT_EQ(custom.out.find("__patchable_function_entries"), std::string::npos) << "IPROBE_CFLAGS replaces the flags";
    }
}

TEST_F(Wrapper, LinkStepColdpatchesTheOutput) {
    const auto r = in_dir(cc() + " -O2 -g main.c helper.c -o app");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.err, "") << "no chatter when stderr is not a terminal";
    ASSERT_TRUE(exists(dir_ / "app.probes"));
    EXPECT_EQ(count_hook_calls(dir_ / "app").total(), 0);
    const probelist::ProbeList list = probelist::ProbeList::load(dir_ / "app.probes");
    std::set<std::string> names;
    for (const auto& p : list.probes) names.insert(p.function);
    EXPECT_EQ(names, (std::set<std::string>{"main", "helper", "plus_one"}));
    EXPECT_EQ(list.probes.size(), 6u);
    EXPECT_EQ(run({dir_ / "app"}).out, "42\n");

    // Separate compile and link steps, the way make does it.
    ASSERT_EQ(in_dir(cc() + " -O2 -c main.c && " + cc() + " -O2 -c helper.c && " + cc() +
                     " main.o helper.o -o app2")
                  .exit_code,
              0);
    EXPECT_EQ(probelist::ProbeList::load(dir_ / "app2.probes").probes.size(), 6u);
    EXPECT_EQ(run({dir_ / "app2"}).out, "42\n");

    const auto verbose = in_dir("IPROBE_CC_VERBOSE=1 " + cc() + " -O2 main.c helper.c -o app3");
    // (some may be relocated entries, under the pad threshold: counted in the entries)
    EXPECT_NE(verbose.err.find("coldpatched app3: 6 probes (3 entry"), std::string::npos) << verbose.err;
    const auto padded = in_dir("IPROBE_CC_VERBOSE=1 " + cc() + " --pad-threshold=0 -O2 main.c helper.c -o app4");
    EXPECT_NE(padded.err.find("coldpatched app4: 6 probes (3 entry, 3 exit)"), std::string::npos) << padded.err;
}

TEST_F(Wrapper, SharedObjectAndStaticLinks) {
    ASSERT_EQ(in_dir(cc() + " -O2 -fPIC -shared helper.c -o libhelper.so").exit_code, 0);
    const probelist::ProbeList lib = probelist::ProbeList::load(dir_ / "libhelper.so.probes");
    EXPECT_NE(lib.flags & IPROBE_PL_FLAG_SHARED, 0u);
    EXPECT_EQ(lib.probes.size(), 4u);
    // The default flow links statically like any other: no hooks to link.
    auto st = in_dir(cc() + " -O2 -static main.c helper.c -o app-static");
    ASSERT_EQ(st.exit_code, 0) << st.err;
    EXPECT_EQ(run({dir_ / "app-static"}).out, "42\n");
    EXPECT_EQ(probelist::ProbeList::load(dir_ / "app-static.probes").probes.size(), 6u);
}

// The finstrument flow: glibc's libc.a aliases the two hooks, so iprobe-cc
// links distinct ones into static programs.
TEST_F(Wrapper, FinstrumentStaticLinksGetDistinctHooks) {
    const std::string cc = this->cc() + " --flow=finstrument";
    const auto st = in_dir(cc + " -O2 -static main.c helper.c -o app-static");
    ASSERT_EQ(st.exit_code, 0) << st.err;
    EXPECT_EQ(run({dir_ / "app-static"}).out, "42\n");
    const probelist::ProbeList list = probelist::ProbeList::load(dir_ / "app-static.probes");
    ASSERT_EQ(list.probes.size(), 6u);
    EXPECT_NE(list.enter_target, list.exit_target) << "iprobe-cc links distinct hooks into static programs";
    // Kinds are exact (not inferred): the same per function as a PIE build.
    ASSERT_EQ(in_dir(cc + " -O2 main.c helper.c -o app-pie").exit_code, 0);
    const probelist::ProbeList pie = probelist::ProbeList::load(dir_ / "app-pie.probes");
    auto kinds = [](const probelist::ProbeList& l) {
        std::multiset<std::pair<std::string, int>> out;
        for (const auto& p : l.probes) out.emplace(p.function, static_cast<int>(p.kind));
        return out;
    };
    EXPECT_EQ(kinds(list), kinds(pie));
    EXPECT_EQ(count_hook_calls(dir_ / "app-static").total(), 0);

    const auto static_pie = in_dir(cc + " -O2 -static-pie main.c helper.c -o app-static-pie");
    ASSERT_EQ(static_pie.exit_code, 0) << static_pie.err;
    EXPECT_EQ(run({dir_ / "app-static-pie"}).out, "42\n");
    EXPECT_EQ(kinds(probelist::ProbeList::load(dir_ / "app-static-pie.probes")), kinds(pie));
}

TEST_F(Wrapper, LinkWithoutPlaceholdersIsNotAnError) {
    std::ofstream(dir_ / "conftest.c") << "int main(void) { return 0; }\n";
    // Everything in conftest is excluded, as configure's probes often are.
    const auto r = in_dir("IPROBE_CFLAGS= " + cc() + " conftest.c -o conftest");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.err, "");
    EXPECT_FALSE(exists(dir_ / "conftest.probes"));
    const auto verbose = in_dir("IPROBE_CC_VERBOSE=1 IPROBE_CFLAGS= " + cc() + " conftest.c -o conftest");
    EXPECT_NE(verbose.err.find("no placeholders"), std::string::npos);
}

TEST_F(Wrapper, FailuresPassThrough) {
    std::ofstream(dir_ / "broken.c") << "int main(void) { return undefined_thing; }\n";
    const auto real = in_dir("gcc broken.c -o broken");
    const auto wrapped = in_dir(cc() + " broken.c -o broken");
    EXPECT_NE(real.exit_code, 0);
    EXPECT_EQ(wrapped.exit_code, real.exit_code);
    EXPECT_NE(wrapped.err.find("undefined_thing"), std::string::npos);
    EXPECT_FALSE(exists(dir_ / "broken"));
    const auto syntax = in_dir(cc() + " -fsyntax-only main.c helper.c");
    EXPECT_EQ(syntax.exit_code, 0) << syntax.err;
    EXPECT_FALSE(exists(dir_ / "a.out"));
    const auto missing = in_dir("IPROBE_CC=/nonexistent/cc " + cc() + " main.c");
    EXPECT_EQ(missing.exit_code, 127);
    EXPECT_NE(missing.err.find("IPROBE_CC"), std::string::npos);
    const auto loop = in_dir("IPROBE_CC=" + cc() + " " + cc() + " main.c helper.c -o x");
    EXPECT_EQ(loop.exit_code, 2);
    EXPECT_NE(loop.err.find("real compiler"), std::string::npos) << loop.err;
}

// Developer-marked points (include/iprobe/iprobe.h) join the probes of the
// -finstrument-functions flow in one list.
TEST_F(Wrapper, MarkedPointsAreListedWithFunctionProbes) {
    std::ofstream(dir_ / "points.c") << R"(#include <stdio.h>
#include "iprobe/iprobe.h"
__attribute__((noinline)) static int lookup(int key) {
    if (key % 2) IPROBE_POINT(cache_miss);
    IPROBE_POINT_ARGS(lookup_done, key, key * 2);
    return key * 3;
}
int main(void) { printf("%d\n", lookup(3) + lookup(4)); return 0; }
)";
    const auto r = in_dir(cc() + " -O2 -I" + source_dir() + "/include points.c -o points");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(run({dir_ / "points"}).out, "21\n");
    const probelist::ProbeList list = probelist::ProbeList::load(dir_ / "points.probes");
    std::multiset<std::pair<std::string, int>> kinds;
    for (const auto& p : list.probes) kinds.emplace(p.function, static_cast<int>(p.kind));
    EXPECT_EQ(kinds.count({"cache_miss", IPROBE_KIND_POINT}), 1u);
    EXPECT_EQ(kinds.count({"lookup_done", IPROBE_KIND_POINT}), 1u);
    EXPECT_EQ(kinds.count({"lookup", IPROBE_KIND_ENTRY}), 1u);
    EXPECT_EQ(kinds.count({"main", IPROBE_KIND_EXIT}), 1u);
    for (std::size_t i = 0; i < list.probes.size(); ++i) EXPECT_EQ(list.probes[i].id, i);
    EXPECT_EQ(run({bin("iprobe"), "list", dir_ / "points", "--count", "--kind", "point"}).out, "2\n");
    EXPECT_EQ(count_hook_calls(dir_ / "points").total(), 0);
}

TEST_F(Wrapper, ClangAsTheRealCompiler) {
    const auto r = in_dir("IPROBE_CC=clang-14 " + cc() + " -O2 main.c helper.c -o app");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_GT(probelist::ProbeList::load(dir_ / "app.probes").probes.size(), 0u);
    EXPECT_EQ(count_hook_calls(dir_ / "app").total(), 0);
    EXPECT_EQ(run({dir_ / "app"}).out, "42\n");
}

TEST_F(Wrapper, LlvmModeLoadsThePassPlugin) {
    std::ofstream(dir_ / "fake.so") << "not a plugin";
    const auto r = in_dir("IPROBE_CC_VERBOSE=1 IPROBE_PASS_PLUGIN=" + dir_.path() + "/fake.so " + cc() +
                          " --mode=llvm -c helper.c -o helper.o");
    EXPECT_NE(r.err.find("running clang-14 -fpass-plugin=" + dir_.path() + "/fake.so -Xclang -load -Xclang"),
              std::string::npos)
        << r.err;
    EXPECT_EQ(r.err.find("-finstrument-functions"), std::string::npos);
    const auto missing = in_dir("IPROBE_MODE=llvm IPROBE_PASS_PLUGIN=/nonexistent/IProbePass.so " + cc() +
                                " -c helper.c");
    EXPECT_EQ(missing.exit_code, 7);
    EXPECT_NE(missing.err.find("IPROBE_PASS_PLUGIN"), std::string::npos);
    // Preprocessing needs no plugin.
    EXPECT_EQ(in_dir("IPROBE_MODE=llvm IPROBE_PASS_PLUGIN=/nonexistent " + cc() + " -E main.c").exit_code, 0);
}

// A binary of the LLVM flow describes its own probes: coldpatch leaves it be.
TEST_F(Wrapper, LlvmFlowBinaryNeedsNoColdpatch) {
    const auto r = in_dir(cc() + " --mode=llvm -O2 main.c helper.c -o app-llvm");
    ASSERT_EQ(r.exit_code, 0) << r.err << " (is the IProbePass target built?)";
    EXPECT_FALSE(exists(dir_ / "app-llvm.probes")) << "links are not coldpatched in llvm mode";
    const auto before = file_bytes(dir_ / "app-llvm");
    const auto again = run({bin("iprobe"), "coldpatch", dir_ / "app-llvm"});
    EXPECT_EQ(again.exit_code, 0) << again.err;
    EXPECT_NE(again.out.find("built with the LLVM flow"), std::string::npos) << again.out;
    EXPECT_EQ(file_bytes(dir_ / "app-llvm"), before);
    EXPECT_FALSE(exists(dir_ / "app-llvm.probes"));
    EXPECT_EQ(run({dir_ / "app-llvm"}).out, "42\n");
}

// The shape of autoconf's probes: each must give the same answer as with gcc.
TEST_F(Wrapper, ConfigureStyleProbes) {
    std::ofstream(dir_ / "configure") << R"SH(#!/bin/sh
set -u
check() { if "$@" >/dev/null 2>&1; then echo "$desc: yes"; else echo "$desc: no"; fi; }
cat > conftest.c <<EOF
int main(void) { return 0; }
EOF
desc="C compiler works"; check $CC conftest.c -o conftest
desc="runs"; check ./conftest
desc="object suffix"; $CC -c conftest.c && ls conftest.o
desc="preprocessor"; check sh -c "echo '#include <stdio.h>' | $CC -E -"
desc="missing header"; check sh -c "echo '#include <no_such_header.h>' | $CC -E -"
cat > conftest.c <<EOF
#include <math.h>
int main(void) { volatile double x = 2.0; return sqrt(x) > 1.0 ? 0 : 1; }
EOF
desc="libm"; check $CC conftest.c -o conftest -lm
cat > conftest.c <<EOF
char no_such_function_xyz(void);
int main(void) { return no_such_function_xyz(); }
EOF
desc="no_such_function_xyz"; check $CC conftest.c -o conftest
cat > conftest.c <<EOF
#include <pthread.h>
static void *run(void *p) { return p; }
int main(void) { pthread_t t; pthread_create(&t, 0, run, 0); return pthread_join(t, 0); }
EOF
desc="pthreads"; check $CC -pthread conftest.c -o conftest
desc="pthreads run"; check ./conftest
desc="-V rejected"; check $CC -V
echo "sizeof long: $(printf '#include <stdio.h>\nint main(void){printf("%%zu",sizeof(long));return 0;}\n' > s.c && $CC s.c -o s && ./s)"
)SH";
    const auto real = in_dir("CC=gcc sh ./configure");
    const auto wrapped = in_dir("CC=" + cc() + " sh ./configure");
    EXPECT_EQ(real.exit_code, 0) << real.err;
    EXPECT_EQ(wrapped.exit_code, 0) << wrapped.err;
    EXPECT_EQ(wrapped.out, real.out);
    EXPECT_NE(real.out.find("C compiler works: yes"), std::string::npos) << real.out;
    EXPECT_NE(real.out.find("no_such_function_xyz: no"), std::string::npos);
}

TEST_F(Wrapper, CmakeProjectWithIprobeCompilers) {
    std::ofstream(dir_ / "CMakeLists.txt") << R"(cmake_minimum_required(VERSION 3.16)
project(tiny C CXX)
add_library(helper SHARED helper.c)
add_executable(app main.c)
target_link_libraries(app helper)
add_executable(cxxapp app.cc)
)";
    std::ofstream(dir_ / "app.cc") << R"(#include <iostream>
#include <vector>
template <typename T> __attribute__((noinline)) T sum(const std::vector<T>& v) { T s{}; for (auto x : v) s += x; return s; }
int main() { std::cout << sum(std::vector<int>{1, 2, 3}) << "\n"; }
)";
    const auto conf = in_dir("cmake -S . -B b -DCMAKE_C_COMPILER=" + cc() + " -DCMAKE_CXX_COMPILER=" +
                             bin("iprobe-c++") + " >conf.log 2>&1 || cat conf.log");
    ASSERT_EQ(conf.exit_code, 0) << conf.out;
    const auto build = in_dir("cmake --build b 2>&1");
    ASSERT_EQ(build.exit_code, 0) << build.out;
    EXPECT_EQ(run({dir_ / "b/app"}).out, "42\n");
    EXPECT_EQ(run({dir_ / "b/cxxapp"}).out, "6\n");
    EXPECT_TRUE(exists(dir_ / "b/app.probes"));
    EXPECT_TRUE(exists(dir_ / "b/libhelper.so.probes"));
    const probelist::ProbeList cxx = probelist::ProbeList::load(dir_ / "b/cxxapp.probes");
    bool found = false;
    for (const auto& p : cxx.probes) found |= p.demangled == "int sum<int>(std::vector<int, std::allocator<int> > const&)";
    EXPECT_TRUE(found);
    for (const char* f : {"b/app", "b/libhelper.so", "b/cxxapp"}) EXPECT_EQ(count_hook_calls(dir_ / f).total(), 0) << f;
}

}  // namespace
}  // namespace iprobe::test
