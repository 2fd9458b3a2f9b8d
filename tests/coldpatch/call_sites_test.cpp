// Coldpatch on every kind of placeholder call site a compiler produces:
// PLT calls in PIE, call *GOT(%rip) with -fno-plt, non-PIE, static, IBT PLTs,
// clang, shared libraries, C++; with and without DWARF.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>
#include <set>

#include "binary_checks.h"
#include "iprobe/coldpatch/coldpatch.h"
#include "iprobe/probelist/probe_list.h"
#include "testutil.h"

namespace iprobe::test {
namespace {

constexpr char kProgram[] = R"(#include <stdio.h>
static inline int square(int x) { return x * x; }
__attribute__((noinline)) int twice(int x) { return 2 * square(x); }
__attribute__((noinline)) void say(const char *s) { puts(s); }
int main(int argc, char **argv) {
    (void)argv;
    say("hello");
    printf("%d\n", twice(argc + 2));
    return 0;
}
)";

void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

struct Variant {
    const char* name;
    const char* compiler;
    const char* flags;
    bool pie;
    bool dwarf;
    probelist::SiteForm form;
    bool aliased_hooks;  // static glibc: enter and exit are one function
};

std::ostream& operator<<(std::ostream& os, const Variant& v) { return os << v.name; }

class CallSites : public ::testing::TestWithParam<Variant> {};

TEST_P(CallSites, EveryHookCallBecomesANopAndIsListed) {
    const Variant& v = GetParam();
    TempDir dir;
    write_text(dir / "prog.c", kProgram);
    compile(dir.path(), std::string(v.compiler) + " -finstrument-functions -fno-optimize-sibling-calls " + v.flags +
                                " prog.c -o raw");
    const auto native = run({dir / "raw"});
    ASSERT_EQ(native.exit_code, 0);
    ASSERT_EQ(native.out, "hello\n18\n");

    const HookCalls before = count_hook_calls(dir / "raw");
    ASSERT_GT(before.total(), 0) << "the compiler emitted no hook calls";
    ASSERT_EQ(before.tail_jumps, 0);

    compile(dir.path(), "cp raw patched");
    const auto r = run({bin("iprobe"), "coldpatch", dir / "patched"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("coldpatched patched: "), std::string::npos) << r.out;

    const probelist::ProbeList list = probelist::ProbeList::load(dir / "patched.probes");
    std::size_t entries = 0, exits = 0;
    for (const auto& p : list.probes) (p.kind == probelist::ProbeKind::entry ? entries : exits)++;
    EXPECT_EQ(list.probes.size(), static_cast<std::size_t>(before.total()));
    if (!v.aliased_hooks) {
        EXPECT_EQ(entries, static_cast<std::size_t>(before.enter));
        EXPECT_EQ(exits, static_cast<std::size_t>(before.exit));
    } else {
        EXPECT_EQ(entries, exits) << "each function here has one entry and one exit";
    }

    const HookCalls after = count_hook_calls(dir / "patched");
    EXPECT_EQ(after.total(), 0);
    EXPECT_EQ(after.tail_jumps, 0);
    expect_only_sites_changed(dir / "raw", dir / "patched", list);

    for (const auto& p : list.probes) {
        EXPECT_EQ(p.form, v.form);
        EXPECT_EQ(p.size, v.form == probelist::SiteForm::call_rel32 ? 5 : 6);
        EXPECT_EQ(p.id, &p - list.probes.data());
        EXPECT_FALSE(p.function.empty());
        EXPECT_EQ(p.demangled, p.function);
        if (v.dwarf) {
            EXPECT_NE(p.file.find("prog.c"), std::string::npos) << p.function << " at " << std::hex << p.site;
            EXPECT_GT(p.line, 0u);
        } else {
            EXPECT_TRUE(p.file.empty());
            EXPECT_EQ(p.line, 0u);
        }
    }
    EXPECT_EQ((list.flags & IPROBE_PL_FLAG_PIE) != 0, v.pie);
    EXPECT_EQ((list.flags & IPROBE_PL_FLAG_SHARED), 0u);
    EXPECT_EQ((list.flags & IPROBE_PL_FLAG_DWARF) != 0, v.dwarf);
    EXPECT_EQ(list.flow, static_cast<std::uint32_t>(IPROBE_FLOW_FINSTRUMENT));
    EXPECT_EQ(list.module, "patched");
    EXPECT_EQ(list.build_id, elf::ElfFile(dir / "raw").build_id());
    EXPECT_FALSE(list.build_id.empty());
    if (v.form == probelist::SiteForm::call_rel32) {
        EXPECT_NE(list.enter_target, 0u);
        EXPECT_NE(list.exit_target, 0u);
    } else {
        EXPECT_EQ(list.enter_target, 0u) << "no PLT entry with -fno-plt";
    }
    if (!v.aliased_hooks && (v.pie || v.form == probelist::SiteForm::call_rip_indirect)) {
        EXPECT_NE(list.enter_got_slot, 0u);
        EXPECT_NE(list.exit_got_slot, 0u);
    }

    // Every instrumented function is named, including `square`, which is
    // inlined into `twice`: gcc still reports it (this_fn in %rdi).
    std::set<std::string> names;
    for (const auto& p : list.probes) names.insert(p.function);
    EXPECT_TRUE(names.count("main"));
    EXPECT_TRUE(names.count("twice"));
    EXPECT_TRUE(names.count("say"));

    const auto patched = run({dir / "patched"});
    EXPECT_EQ(patched.exit_code, native.exit_code);
    EXPECT_EQ(patched.out, native.out);

    // What the hooks receive at run time names each executed probe.
    if (!v.aliased_hooks) {  // a static program cannot be given an LD_PRELOAD recorder
        const auto recorded_run = run({dir / "raw"}, {}, std::chrono::seconds(60), recorder_env(dir / "hooks.log"));
        EXPECT_EQ(recorded_run.out, native.out);
        const RecordedCheck check = check_recorded(dir / "hooks.log", list);
        EXPECT_GE(check.sites, 6u) << "main, say and twice (with square) ran";
        for (const auto& problem : check.problems) ADD_FAILURE() << problem;
        for (const auto& problem : check.misnamed) ADD_FAILURE() << problem;
    }
}

INSTANTIATE_TEST_SUITE_P(
    Compilers, CallSites,
    ::testing::Values(Variant{"gcc_pie_plt", "gcc", "-O2", true, false, probelist::SiteForm::call_rel32, false},
                      Variant{"gcc_pie_plt_dwarf", "gcc", "-O2 -g", true, true, probelist::SiteForm::call_rel32, false},
                      Variant{"gcc_O0_dwarf", "gcc", "-O0 -g", true, true, probelist::SiteForm::call_rel32, false},
                      Variant{"gcc_no_plt", "gcc", "-O2 -fno-plt", true, false, probelist::SiteForm::call_rip_indirect, false},
                      Variant{"gcc_no_plt_nonpie", "gcc", "-O2 -fno-plt -no-pie", false, false,
                              probelist::SiteForm::call_rip_indirect, false},
                      Variant{"gcc_nonpie", "gcc", "-O2 -no-pie", false, false, probelist::SiteForm::call_rel32, false},
                      Variant{"gcc_static", "gcc", "-O2 -static", false, false, probelist::SiteForm::call_rel32, true},
                      Variant{"gcc_ibt_plt_sec", "gcc", "-O2 -fcf-protection=full", true, false,
                              probelist::SiteForm::call_rel32, false},
                      Variant{"clang_pie", "clang-14", "-O2 -g", true, true, probelist::SiteForm::call_rel32, false},
                      // clang emits the hooks after -fno-plt is applied: they stay PLT calls.
                      Variant{"clang_no_plt", "clang-14", "-O2 -fno-plt", true, false, probelist::SiteForm::call_rel32, false}),
    [](const ::testing::TestParamInfo<Variant>& info) { return std::string(info.param.name); });

// Without -fno-optimize-sibling-calls (which iprobe-cc adds) gcc may end a
// void function with `jmp __cyg_profile_func_exit`: not a call, so not a
// placeholder.  Coldpatch leaves it, says so, and patches the rest.
TEST(CallSites, TailJumpsToTheExitHookAreReportedNotPatched) {
    TempDir dir;
    write_text(dir / "prog.c", kProgram);
    compile(dir.path(), "gcc -O2 -finstrument-functions prog.c -o prog");
    const HookCalls before = count_hook_calls(dir / "prog");
    ASSERT_EQ(before.tail_jumps, 1) << "say() ends in a tail jump to the exit hook";
    const auto r = run({bin("iprobe"), "coldpatch", dir / "prog"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("1 tail jump(s) to a hook left in place"), std::string::npos) << r.err;
    const HookCalls after = count_hook_calls(dir / "prog");
    EXPECT_EQ(after.total(), 0);
    EXPECT_EQ(after.tail_jumps, 1);
    EXPECT_EQ(probelist::ProbeList::load(dir / "prog.probes").probes.size(), static_cast<std::size_t>(before.total()));
    EXPECT_EQ(run({dir / "prog"}).out, "hello\n18\n");
}

TEST(CallSites, InlinedFunctionIsNamedByItsOwnAddress) {
    TempDir dir;
    write_text(dir / "prog.c", kProgram);
    compile(dir.path(), "gcc -O2 -finstrument-functions prog.c -o prog");
    const auto nm = run({"nm", "-S", dir / "prog"});
    std::uint64_t twice = 0, twice_size = 0, square = 0;
    std::istringstream lines(nm.out);
    std::string addr, size, type, name;
    while (lines >> addr) {
        std::string rest;
        std::getline(lines, rest);
        std::istringstream fields(rest);
        if (!(fields >> size >> type >> name)) continue;
        if (name == "twice") twice = std::stoull(addr, nullptr, 16), twice_size = std::stoull(size, nullptr, 16);
        if (name == "square") square = std::stoull(addr, nullptr, 16);
    }
    ASSERT_NE(twice, 0u);
    ASSERT_NE(square, 0u) << "gcc keeps an out-of-line square because its address is passed to the hooks";
    ASSERT_EQ(run({bin("iprobe"), "coldpatch", "-q", dir / "prog"}).exit_code, 0);
    const probelist::ProbeList list = probelist::ProbeList::load(dir / "prog.probes");
    int inlined = 0;
    for (const auto& p : list.probes) {
        if (p.site < twice || p.site >= twice + twice_size) continue;
        if (p.function == "square") {
            ++inlined;
            EXPECT_EQ(p.function_address, square);
        } else {
            EXPECT_EQ(p.function, "twice");
            EXPECT_EQ(p.function_address, twice);
        }
    }
    EXPECT_EQ(inlined, 2) << "square's entry and exit inside twice";
}

TEST(CallSites, SharedLibraryAndItsExecutable) {
    TempDir dir;
    write_text(dir / "lib.c", R"(#include <stdio.h>
__attribute__((noinline)) static int helper(int x) { return x + 1; }
int lib_value(int x) { return helper(x) * 3; }
void lib_print(int v) { printf("value %d\n", v); }
)");
    write_text(dir / "main.c", R"(int lib_value(int); void lib_print(int);
int main(void) { lib_print(lib_value(4)); return 0; }
)");
    compile(dir.path(), "gcc -O2 -g -fPIC -shared -finstrument-functions -fno-optimize-sibling-calls -Wl,-soname,libdemo.so lib.c -o libdemo.so");
    compile(dir.path(), "gcc -O2 -finstrument-functions -fno-optimize-sibling-calls main.c -L. -ldemo -Wl,-rpath,'$ORIGIN' -o app");
    compile(dir.path(), "cp libdemo.so libdemo.raw && cp app app.raw");
    const auto native = run({dir / "app"});
    ASSERT_EQ(native.out, "value 15\n");
    const HookCalls lib_before = count_hook_calls(dir / "libdemo.so");

    for (const char* f : {"libdemo.so", "app"}) {
        const auto r = run({bin("iprobe"), "coldpatch", dir / f});
        ASSERT_EQ(r.exit_code, 0) << r.err;
        EXPECT_EQ(count_hook_calls(dir / f).total(), 0);
    }
    const probelist::ProbeList lib = probelist::ProbeList::load(dir / "libdemo.so.probes");
    EXPECT_EQ(lib.probes.size(), static_cast<std::size_t>(lib_before.total()));
    EXPECT_EQ(lib_before.total(), 6) << "helper, lib_value, lib_print: entry + exit each";
    EXPECT_NE(lib.flags & IPROBE_PL_FLAG_SHARED, 0u);
    EXPECT_NE(lib.flags & IPROBE_PL_FLAG_PIE, 0u);
    EXPECT_NE(lib.flags & IPROBE_PL_FLAG_DWARF, 0u);
    EXPECT_EQ(lib.module, "libdemo.so");
    std::set<std::string> names;
    for (const auto& p : lib.probes) names.insert(p.function);
    EXPECT_EQ(names, (std::set<std::string>{"helper", "lib_value", "lib_print"}));
    expect_only_sites_changed(dir / "libdemo.raw", dir / "libdemo.so", lib);
    const probelist::ProbeList app = probelist::ProbeList::load(dir / "app.probes");
    EXPECT_EQ(app.flags & IPROBE_PL_FLAG_SHARED, 0u);
    expect_only_sites_changed(dir / "app.raw", dir / "app", app);

    const auto patched = run({dir / "app"});
    EXPECT_EQ(patched.exit_code, 0);
    EXPECT_EQ(patched.out, native.out);
}

TEST(CallSites, CxxNamesAreDemangled) {
    TempDir dir;
    write_text(dir / "prog.cc", R"(#include <cstdio>
#include <stdexcept>
namespace ns {
template <typename T> struct Box {
    T v;
    __attribute__((noinline)) T get() const { if (v < 0) throw std::runtime_error("negative"); return v; }
};
struct Base { virtual ~Base() = default; virtual int id() const = 0; };
struct Derived : Base { __attribute__((noinline)) int id() const override { return 7; } };
}
int main() {
    ns::Box<int> b{5};
    ns::Derived d;
    const ns::Base& base = d;
    int caught = 0;
    try { ns::Box<int>{-1}.get(); } catch (const std::exception&) { caught = 1; }
    std::printf("%d %d %d\n", b.get(), base.id(), caught);
}
)");
    compile(dir.path(), "g++ -O2 -g -finstrument-functions -fno-optimize-sibling-calls prog.cc -o raw && cp raw prog");
    const auto native = run({dir / "raw"});
    ASSERT_EQ(native.out, "5 7 1\n");
    const HookCalls before = count_hook_calls(dir / "raw");
    ASSERT_EQ(run({bin("iprobe"), "coldpatch", "-q", dir / "prog"}).exit_code, 0);
    const probelist::ProbeList list = probelist::ProbeList::load(dir / "prog.probes");
    EXPECT_EQ(list.probes.size(), static_cast<std::size_t>(before.total()));
    EXPECT_EQ(count_hook_calls(dir / "prog").total(), 0);
    std::map<std::string, std::string> raw_of;
    for (const auto& p : list.probes) raw_of[p.demangled] = p.function;
    EXPECT_EQ(raw_of["ns::Box<int>::get() const"], "_ZNK2ns3BoxIiE3getEv");
    EXPECT_EQ(raw_of["ns::Derived::id() const"], "_ZNK2ns7Derived2idEv");
    EXPECT_EQ(raw_of["main"], "main");
    expect_only_sites_changed(dir / "raw", dir / "prog", list);
    EXPECT_EQ(run({dir / "prog"}).out, native.out);

    const auto listed = run({bin("iprobe"), "list", dir / "prog", "--functions", "ns::Box*"});
    EXPECT_EQ(listed.exit_code, 0);
    EXPECT_NE(listed.out.find("ns::Box<int>::get() const"), std::string::npos);
    EXPECT_EQ(listed.out.find("ns::Derived"), std::string::npos);
}

}  // namespace
}  // namespace iprobe::test
