// The LLVM pass flow end to end: programs built with `iprobe-cc --mode=llvm`
// carry exactly the probes expected, behave like native builds, and their
// placeholders are safe to enable everywhere (checked with selfpatch.c, an
// in-process stand-in for `iprobe attach` that enables every site).
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <regex>
#include <thread>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "iprobe/probelist/probe_source.h"
#include "iprobe/probelist/site_section.h"
#include "iprobe/support/error.h"
#include "testutil.h"

namespace iprobe::test {
namespace {

std::string data(const std::string& name) { return source_dir() + "/tests/llvm-pass/data/" + name; }
std::string include_dir() { return source_dir() + "/include"; }

std::string describe(const CommandResult& r) {
    return "exit " + std::to_string(r.exit_code) + "\nstdout:\n" + r.out + "\nstderr:\n" + r.err;
}

void must(const CommandResult& r) { ASSERT_EQ(r.exit_code, 0) << describe(r); }

// The in-process enabler, built without the pass (it must not probe itself).
std::string selfpatch_object(const TempDir& dir) {
    const std::string object = dir / "selfpatch.o";
    const auto r = run({"clang-14", "-O2", "-Wall", "-Wextra", "-Werror", "-I" + include_dir(), "-c",
                        data("selfpatch.c"), "-o", object});
    EXPECT_EQ(r.exit_code, 0) << describe(r);
    return object;
}

// iprobe-cc in llvm mode, as a user runs it.
CommandResult llvm_cc(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
    std::vector<std::string> argv{bin("iprobe-cc"), "--mode=llvm", "-I" + include_dir()};
    argv.insert(argv.end(), args.begin(), args.end());
    return run(argv, {}, std::chrono::seconds(120), env);
}

struct SelfpatchReport {
    std::map<std::string, unsigned long> entries, exits, points;  // summed over sites
    std::map<std::string, int> entry_sites, exit_sites, point_sites;
    std::vector<std::string> point_events;  // "name arg..." in order
};

SelfpatchReport read_report(const std::string& path) {
    SelfpatchReport report;
    std::istringstream in(file_text(path));
    std::string line;
    while (std::getline(in, line)) {
        std::istringstream words(line);
        std::string tag;
        words >> tag;
        if (tag == "site") {
            std::string kind, name;
            unsigned long count = 0;
            words >> kind >> name >> count;
            if (kind == "entry") report.entries[name] += count, report.entry_sites[name]++;
            if (kind == "exit") report.exits[name] += count, report.exit_sites[name]++;
            if (kind == "point") report.points[name] += count, report.point_sites[name]++;
        } else if (tag == "point") {
            report.point_events.push_back(line.substr(6));
        }
    }
    return report;
}

const std::set<std::string> kKnownFunctions = {"main",         "leaf_redzone", "point_args", "tail_callee",
                                               "tail_caller",  "recurse",      "multi_return", "float_work",
                                               "never_called", "tiny"};

std::map<std::string, int> count_by_function(const probelist::ProbeList& list, probelist::ProbeKind kind) {
    std::map<std::string, int> counts;
    for (const probelist::Probe& p : list.probes)
        if (p.kind == kind) counts[p.function]++;
    return counts;
}

std::set<std::string> keys(const std::map<std::string, int>& m) {
    std::set<std::string> out;
    for (const auto& [k, v] : m) out.insert(k);
    return out;
}

class KnownProgram : public ::testing::TestWithParam<std::string> {};

// Every selected function has exactly one entry probe and one exit probe,
// the developer points are there, IPROBE_NEVER is honoured, and the records
// carry what docs/design.md §2 asks for.
TEST_P(KnownProgram, ListsExactlyTheExpectedProbes) {
    TempDir dir;
    const std::string exe = dir / "known";
    must(llvm_cc({GetParam(), "-g", data("known.c"), "-o", exe}));

    const probelist::ProbeList list = probelist::load_probes(exe);
    EXPECT_EQ(list.flow, IPROBE_FLOW_LLVM);
    EXPECT_FALSE(list.build_id.empty());
    EXPECT_TRUE(list.flags & IPROBE_PL_FLAG_DWARF);

    const auto entries = count_by_function(list, probelist::ProbeKind::entry);
    EXPECT_EQ(keys(entries), kKnownFunctions);
    for (const auto& [name, count] : entries) EXPECT_EQ(count, 1) << name;
    const auto exits = count_by_function(list, probelist::ProbeKind::exit);
    EXPECT_EQ(keys(exits), kKnownFunctions);
    const auto points = count_by_function(list, probelist::ProbeKind::point);
    EXPECT_EQ(points, (std::map<std::string, int>{{"known_args", 1}, {"known_start", 1}}));

    for (std::size_t i = 0; i < list.probes.size(); ++i) {
        const probelist::Probe& p = list.probes[i];
        EXPECT_EQ(p.id, i);
        // A function's one site is its patchable entry, clang's own 5-byte
        // NOP; its exit is that site's return trampoline.
        if (p.kind == probelist::ProbeKind::entry) {
            EXPECT_TRUE(probelist::serves_returns(list.probes, i)) << p.function;
        }
        EXPECT_EQ(p.form, p.kind == probelist::ProbeKind::exit ? probelist::SiteForm::ret : probelist::SiteForm::nop);
        EXPECT_EQ(p.size, 5);
        EXPECT_EQ(probelist::hex(p.placeholder),
                  p.kind == probelist::ProbeKind::point ? "0f1f440000000000" : "0f1f440008000000");
        EXPECT_EQ(p.original, p.placeholder);
        EXPECT_NE(p.function_address, 0u) << p.function;
        EXPECT_LE(p.function_address, p.site) << p.function;
        EXPECT_TRUE(p.file.ends_with("known.c")) << p.function << " " << p.file;
        EXPECT_GT(p.line, 0u) << p.function;
    }

    // The CLI shows the same list.
    const auto listed = run({bin("iprobe"), "list", exe, "--json"});
    must(listed);
    EXPECT_NE(listed.out.find("\"flow\":\"llvm\""), std::string::npos) << listed.out;
    EXPECT_NE(listed.out.find("\"function\":\"known_args\""), std::string::npos);
    EXPECT_NE(listed.out.find("\"kind\":\"point\""), std::string::npos);
}

// Enabling every placeholder (NOP -> call to a register-preserving
// trampoline) changes nothing the program computes, and counts every call.
TEST_P(KnownProgram, EnabledEverywhereCountsExactlyAndChangesNothing) {
    TempDir dir;
    const std::string native = dir / "native", probed = dir / "probed", report_path = dir / "report";
    const std::string selfpatch = selfpatch_object(dir);
    must(run({"clang-14", GetParam(), "-I" + include_dir(), data("known.c"), "-o", native}));
    must(llvm_cc({GetParam(), data("known.c"), selfpatch, "-o", probed}));

    const auto expected = run({native});
    must(expected);
    const auto disabled = run({probed});
    must(disabled);
    const auto enabled = run({probed}, {}, std::chrono::seconds(60), {"IPROBE_SELFPATCH_OUT=" + report_path});
    must(enabled);
    EXPECT_EQ(disabled.out, expected.out);
    EXPECT_EQ(enabled.out, expected.out);

    const SelfpatchReport report = read_report(report_path);
    const std::map<std::string, unsigned long> calls = {
        {"main", 1},        {"leaf_redzone", 1000}, {"point_args", 3}, {"tail_callee", 10},
        {"tail_caller", 10}, {"recurse", 6},         {"multi_return", 10}, {"float_work", 1},
        {"never_called", 0}, {"tiny", 1}};
    EXPECT_EQ(report.entries, calls);
    EXPECT_EQ(report.exits, calls);
    EXPECT_EQ(report.points, (std::map<std::string, unsigned long>{{"known_args", 3}, {"known_start", 1}}));

    // The argument registers arrive intact, the pointer included.
    const std::string prefix = "known_ptr=";
    const auto at = enabled.err.find(prefix);
    ASSERT_NE(at, std::string::npos) << enabled.err;
    const std::string pointer = enabled.err.substr(at + prefix.size(), enabled.err.find('\n', at) - at - prefix.size());
    EXPECT_EQ(report.point_events,
              (std::vector<std::string>{"known_start", "known_args 0x1122334455667788 0xffffffffffffffff " + pointer + " 0x2a",
                                        "known_args 0x7 0x8 0 0xfffffffffffffff7",
                                        "known_args 0x1 0x2 0xdeadbeef 0"}));
}

INSTANTIATE_TEST_SUITE_P(OptLevels, KnownProgram, ::testing::Values("-O0", "-O2", "-O3", "-Os"),
                         [](const auto& info) { return info.param.substr(1); });

// Several threads: exact counts for every thread's calls.
TEST(LlvmPass, MultiThreadedCountsAreExact) {
    TempDir dir;
    const std::string native = dir / "native", probed = dir / "probed", report_path = dir / "report";
    const std::string selfpatch = selfpatch_object(dir);
    must(run({"clang-14", "-O2", "-I" + include_dir(), data("threads.c"), "-o", native, "-lpthread"}));
    must(llvm_cc({"-O2", data("threads.c"), selfpatch, "-o", probed, "-lpthread"}));
    const auto expected = run({native});
    must(expected);
    const auto enabled = run({probed}, {}, std::chrono::seconds(60), {"IPROBE_SELFPATCH_OUT=" + report_path});
    must(enabled);
    EXPECT_EQ(enabled.out, expected.out);
    SelfpatchReport report = read_report(report_path);
    EXPECT_EQ(report.entries["work"], 100000u);
    EXPECT_EQ(report.exits["work"], 100000u);
    EXPECT_EQ(report.entries["worker"], 4u);
    EXPECT_EQ(report.points["worker_done"], 4u);
    std::multiset<std::string> done(report.point_events.begin(), report.point_events.end());
    const std::string sum = "0x30a28c";
    EXPECT_EQ(done, (std::multiset<std::string>{"worker_done 0 " + sum, "worker_done 0x1 " + sum,
                                                "worker_done 0x2 " + sum, "worker_done 0x3 " + sum}));
}

std::set<std::string> entry_functions(const std::string& exe) {
    return keys(count_by_function(probelist::load_probes(exe), probelist::ProbeKind::entry));
}

TEST(LlvmPass, FiltersSelectByNameSizeAndAnnotation) {
    TempDir dir;
    const std::string exe = dir / "known";
    // IPROBE_ALWAYS (tiny) is in whatever the filters say.
    must(llvm_cc({"-O2", data("known.c"), "-o", exe}, {"IPROBE_FILTER=^(leaf_redzone|main)$"}));
    EXPECT_EQ(entry_functions(exe), (std::set<std::string>{"leaf_redzone", "main", "tiny"}));
    // Developer points are not subject to the function filters.
    EXPECT_EQ(count_by_function(probelist::load_probes(exe), probelist::ProbeKind::point).size(), 2u);

    must(llvm_cc({"-O2", "-mllvm", "-iprobe-exclude=^tail_|recurse", data("known.c"), "-o", exe}));
    auto expected = kKnownFunctions;
    expected.erase("tail_caller");
    expected.erase("tail_callee");
    expected.erase("recurse");
    EXPECT_EQ(entry_functions(exe), expected);

    // A command-line option wins over the environment.
    must(llvm_cc({"-O2", "-mllvm", "-iprobe-filter=^float_work$", data("known.c"), "-o", exe},
                 {"IPROBE_FILTER=^main$"}));
    EXPECT_EQ(entry_functions(exe), (std::set<std::string>{"float_work", "tiny"}));

    must(llvm_cc({"-O2", data("known.c"), "-o", exe}, {"IPROBE_MIN_SIZE=40"}));
    const auto big = entry_functions(exe);
    EXPECT_TRUE(big.contains("main") && big.contains("tiny")) << ::testing::PrintToString(big);
    EXPECT_FALSE(big.contains("tail_caller") || big.contains("tail_callee") || big.contains("never_called"));

    must(llvm_cc({"-O2", data("known.c"), "-o", exe}, {"IPROBE_ONLY_ANNOTATED=1"}));
    EXPECT_EQ(entry_functions(exe), (std::set<std::string>{"tiny"}));
}

TEST(LlvmPass, InvalidFilterIsACompileError) {
    TempDir dir;
    const std::string exe = dir / "known";
    auto r = llvm_cc({"-O2", "-mllvm", "-iprobe-filter=leaf(", data("known.c"), "-o", exe});
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find("iprobe: invalid filter"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("'leaf('"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("parentheses not balanced"), std::string::npos) << r.err;

    r = llvm_cc({"-O2", data("known.c"), "-o", exe}, {"IPROBE_EXCLUDE=[a-"});
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find("iprobe: invalid exclude"), std::string::npos) << r.err;

    r = llvm_cc({"-O2", data("known.c"), "-o", exe}, {"IPROBE_MIN_SIZE=ten"});
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find("IPROBE_MIN_SIZE='ten'"), std::string::npos) << r.err;

    EXPECT_FALSE(std::ifstream(exe).good()) << "a failed compile must not leave an executable";
}

// IPROBE_POINT is pure inline asm: gcc builds carry the same records.
TEST(LlvmPass, DeveloperPointsWorkWithGcc) {
    TempDir dir;
    const std::string exe = dir / "known-gcc", report_path = dir / "report";
    const std::string selfpatch = selfpatch_object(dir);
    for (const char* lang : {"c", "c++"}) {
        SCOPED_TRACE(lang);
        must(run({std::string(lang) == "c" ? "gcc" : "g++", "-x", lang, "-O2", "-Wall", "-Wextra", "-Werror",
                  "-I" + include_dir(), data("known.c"), "-x", "none", selfpatch, "-o", exe}));
        const probelist::ProbeList list = probelist::load_probes(exe);
        EXPECT_EQ(count_by_function(list, probelist::ProbeKind::point),
                  (std::map<std::string, int>{{"known_args", 1}, {"known_start", 1}}));
        EXPECT_TRUE(count_by_function(list, probelist::ProbeKind::entry).empty());
        const auto r = run({exe}, {}, std::chrono::seconds(60), {"IPROBE_SELFPATCH_OUT=" + report_path});
        must(r);
        const SelfpatchReport report = read_report(report_path);
        ASSERT_EQ(report.point_events.size(), 4u);
        EXPECT_EQ(report.point_events[2], "known_args 0x7 0x8 0 0xfffffffffffffff7");
    }
}

// C++: templates and inline functions live in COMDAT groups; their records
// follow the group, so duplicates discarded by the linker take their records
// along.  Shared libraries: preemptible symbols need no dynamic relocation.
TEST(LlvmPass, CxxComdatAndSharedLibraries) {
    TempDir dir;
    const std::string lib = dir / "libshapes.so", exe = dir / "app";
    const std::string a = dir / "a.cpp", b = dir / "b.cpp", header = dir / "shape.h";
    std::ofstream(header) << "#include <string>\n#include \"iprobe/iprobe.h\"\n"
                             "template <typename T> struct Shape { T side;\n"
                             "  __attribute__((noinline)) T area() const { IPROBE_POINT_ARGS(area, side); return side * side; } };\n"
                             "inline std::string label(int n) { return \"n=\" + std::to_string(n); }\n"
                             "int lib_area(int);\n";
    std::ofstream(a) << "#include \"shape.h\"\nint lib_area(int s) { return Shape<int>{s}.area() + (int)label(s).size(); }\n";
    std::ofstream(b) << "#include <cstdio>\n#include \"shape.h\"\n"
                        "int main() { std::printf(\"%d %d %s\\n\", Shape<int>{3}.area(), lib_area(4), label(5).c_str()); }\n";
    auto cxx = [&](std::vector<std::string> args) {
        std::vector<std::string> argv{bin("iprobe-c++"), "--mode=llvm", "-O2", "-g", "-I" + include_dir(), "-I" + dir.path()};
        argv.insert(argv.end(), args.begin(), args.end());
        return run(argv);
    };
    must(cxx({"-fPIC", "-shared", a, "-o", lib}));
    must(cxx({b, a, "-o", dir / "static-app"}));  // both objects instantiate Shape<int>::area
    must(cxx({b, "-L" + dir.path(), "-lshapes", "-Wl,-rpath," + dir.path(), "-o", exe}));
    const auto r = run({exe});
    must(r);
    EXPECT_EQ(r.out, "9 19 n=5\n");
    EXPECT_EQ(run({dir / "static-app"}).out, "9 19 n=5\n");

    const probelist::ProbeList shared = probelist::load_probes(lib);
    EXPECT_TRUE(shared.flags & IPROBE_PL_FLAG_SHARED);
    bool found = false;
    for (const probelist::Probe& p : shared.probes)
        if (p.demangled == "lib_area(int)" && p.kind == probelist::ProbeKind::entry) found = true;
    EXPECT_TRUE(found);

    // One Shape<int>::area survives the link, with one entry and one point.
    const probelist::ProbeList merged = probelist::load_probes(dir / "static-app");
    int area_entries = 0, area_points = 0;
    for (const probelist::Probe& p : merged.probes) {
        if (p.demangled == "Shape<int>::area() const" && p.kind == probelist::ProbeKind::entry) ++area_entries;
        if (p.function == "area" && p.kind == probelist::ProbeKind::point) ++area_points;
    }
    EXPECT_EQ(area_entries, 1);
    EXPECT_EQ(area_points, 1);
}

// --gc-sections keeps the records (SHF_GNU_RETAIN), and a stripped binary
// still lists its probes (names live in the section, not the symbol table).
TEST(LlvmPass, SurvivesGcSectionsAndStrip) {
    TempDir dir;
    const std::string exe = dir / "known";
    must(llvm_cc({"-O2", "-ffunction-sections", "-Wl,--gc-sections", data("known.c"), "-o", exe}));
    EXPECT_EQ(entry_functions(exe), kKnownFunctions);
    must(run({"strip", exe}));
    const probelist::ProbeList list = probelist::load_probes(exe);
    EXPECT_EQ(keys(count_by_function(list, probelist::ProbeKind::entry)), kKnownFunctions);
    // Entry/exit keep their function (recorded, or the entry site); a point
    // in a stripped binary has no symbol to name its function.
    for (const probelist::Probe& p : list.probes)
        if (p.kind != probelist::ProbeKind::point) {
            EXPECT_NE(p.function_address, 0u) << p.function;
        }
}

TEST(LlvmPass, ObjectFilesAreRefusedWithAHint) {
    TempDir dir;
    const std::string object = dir / "known.o";
    must(llvm_cc({"-O2", "-c", data("known.c"), "-o", object}));
    try {
        probelist::read_site_section(object);
        FAIL() << "an unlinked object was accepted";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ExitCode::bad_input);
        EXPECT_NE(std::string(e.what()).find("link it"), std::string::npos) << e.what();
    }
}

// Build systems drive the wrapper like any compiler.
TEST(LlvmPass, CMakeAndConfigureStyleBuilds) {
    TempDir dir;
    const std::string cmake_build = dir / "cmake-build";
    must(run({"cmake", "-S", data("cmake-project"), "-B", cmake_build, "-DCMAKE_C_COMPILER=" + bin("iprobe-cc"),
              "-DCMAKE_C_FLAGS=-I" + include_dir()},
             {}, std::chrono::seconds(120), {"IPROBE_MODE=llvm"}));
    must(run({"cmake", "--build", cmake_build}, {}, std::chrono::seconds(120), {"IPROBE_MODE=llvm"}));
    auto r = run({cmake_build + "/greeter", "world"});
    must(r);
    EXPECT_EQ(r.out, "hello, world (5)\n");
    EXPECT_EQ(entry_functions(cmake_build + "/greeter"), (std::set<std::string>{"main", "greet", "measure"}));

    const std::string tree = dir / "configure-project";
    must(run({"cp", "-r", data("configure-project"), tree}));
    must(sh("cd '" + tree + "' && IPROBE_MODE=llvm ./configure CC='" + bin("iprobe-cc") + "' CFLAGS='-O2 -I" +
            include_dir() + "' && make"));
    r = run({tree + "/greeter", "there"});
    must(r);
    EXPECT_EQ(r.out, "hello, there (5)\n");
    EXPECT_EQ(entry_functions(tree + "/greeter"), (std::set<std::string>{"main", "greet", "measure"}));
}

// ---------------------------------------------------------------- examples

std::string exchange(int port, const std::string& request) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<std::uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    std::string reply;
    if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
        ::send(fd, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size())) {
        char buffer[4096];
        ssize_t n;
        while ((n = ::recv(fd, buffer, sizeof buffer, 0)) > 0) reply.append(buffer, static_cast<std::size_t>(n));
    }
    ::close(fd);
    return reply;
}

int wait_for_listening(const std::string& stdout_path) {
    const std::regex listening("listening on 127\\.0\\.0\\.1:([0-9]+)");
    for (int i = 0; i < 200; ++i) {
        std::smatch match;
        const std::string text = file_text(stdout_path);
        if (std::regex_search(text, match, listening)) return std::stoi(match[1]);
        std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    return -1;
}

// The echo service's replies and final report, for one build of it.
std::string echo_session(const std::string& exe, const TempDir& dir) {
    const std::string out = dir / (std::filesystem::path(exe).filename().string() + ".out");
    Child server({exe, "--port", "0", "--threads", "2"}, out);
    const int port = wait_for_listening(out);
    EXPECT_GT(port, 0) << file_text(out);
    std::string transcript;
    transcript += exchange(port, "ECHO hello world\nUPPER MiXeD case\nREV abcdef\nSUM 1 2 3 -10 40\nNOPE\nQUIT\n");
    transcript += exchange(port, "SUM 7 8\nSTATS\nQUIT\n");
    transcript += exchange(port, "SHUTDOWN\n");
    EXPECT_EQ(server.wait(std::chrono::seconds(20)), 0);
    const std::string report = file_text(out);
    return transcript + report.substr(report.find('\n') + 1);  // the port differs
}

TEST(LlvmPassExamples, BehaveAsNativeBuilds) {
    TempDir dir;
    const std::string examples = source_dir() + "/examples/";
    const std::string native_echo = dir / "echo-native", llvm_echo = dir / "echo-llvm";
    must(run({"gcc", "-O2", "-std=gnu11", examples + "echo-service/echo_service.c", "-o", native_echo, "-pthread"}));
    must(llvm_cc({"-O2", "-g", "-std=gnu11", examples + "echo-service/echo_service.c", "-o", llvm_echo, "-pthread"}));
    const std::string expected = echo_session(native_echo, dir);
    EXPECT_TRUE(expected.starts_with("hello world\nMIXED CASE\nfedcba\n36\nERR unknown command\nbye\n15\n"))
        << expected;
    EXPECT_EQ(echo_session(llvm_echo, dir), expected);
    const auto echo_entries = entry_functions(llvm_echo);
    EXPECT_TRUE(echo_entries.contains("worker") && echo_entries.contains("main"))
        << ::testing::PrintToString(echo_entries);

    const std::string native_shapes = dir / "shapes-native", llvm_shapes = dir / "shapes-llvm";
    must(run({"g++", "-O2", "-std=c++20", examples + "shapes/shapes.cpp", "-o", native_shapes}));
    must(run({bin("iprobe-c++"), "--mode=llvm", "-O2", "-g", "-std=c++20", examples + "shapes/shapes.cpp", "-o",
              llvm_shapes}));
    for (const std::string count : {"1", "12", "1000"}) {
        const auto expected_shapes = run({native_shapes, count});
        must(expected_shapes);
        const auto got = run({llvm_shapes, count});
        must(got);
        EXPECT_EQ(got.out, expected_shapes.out) << count;
    }
    EXPECT_GT(count_by_function(probelist::load_probes(llvm_shapes), probelist::ProbeKind::entry).size(), 3u);

    const std::string llvm_micro = dir / "microbench-llvm";
    must(llvm_cc({"-O2", "-Wno-unknown-attributes", examples + "microbench/microbench.c", "-o", llvm_micro}));
    const auto micro = run({llvm_micro, "1000"});
    must(micro);
    EXPECT_TRUE(micro.out.starts_with("calls=1000 ")) << micro.out;
    EXPECT_EQ(count_by_function(probelist::load_probes(llvm_micro), probelist::ProbeKind::entry)["empty_function"], 1);
}

// ---------------------------------------------------------------- hotpatch

bool wait_for_file(const std::string& path, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
        if (std::filesystem::exists(path)) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
}

// The real thing: `iprobe attach` enables the pass's NOPs in a running
// multi-threaded process; the trace has every call exactly once and the
// point's four argument registers.
TEST(LlvmPassHotpatch, AttachCountsExactlyAndPointArgsArrive) {
    TempDir dir;
    const std::string exe = dir / "target";
    must(llvm_cc({"-O2", "-g", data("attach_target.c"), "-o", exe, "-lpthread"}));
    Child target({exe, dir.path()}, dir / "out");
    for (int i = 0; i < 400 && file_text(dir / "out").find("ready") == std::string::npos; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const std::string pid = std::to_string(target.pid());

    // A ring that holds every event of a thread: the trace below is exact.
    const auto attached =
        run({bin("iprobe"), "attach", pid, "--probes", exe, "--functions", "attach_*", "--buffer", "4M", "--json"});
    must(attached);
    EXPECT_NE(attached.out.find("\"enabled\":5"), std::string::npos) << attached.out;  // 2 entries, 2 exits, 1 point

    std::ofstream(dir / "go").close();
    ASSERT_TRUE(wait_for_file(dir / "done", std::chrono::seconds(30))) << file_text(dir / "out");
    const auto trace = run({bin("iprobe"), "trace", pid, "--duration", "0"});
    must(trace);

    std::map<std::string, int> events;
    std::multiset<std::string> point_args;
    std::istringstream lines(trace.out);
    std::string line;
    while (std::getline(lines, line)) {
        std::istringstream words(line);
        std::string time, tid, arrow, name;
        words >> time >> tid >> arrow >> name;
        events[arrow + " " + name]++;
        if (arrow == "@") point_args.insert(line.substr(line.find('(')));
    }
    EXPECT_EQ(events, (std::map<std::string, int>{{"-> attach_work", 6000},
                                                   {"<- attach_work", 6000},
                                                   {"-> attach_tail", 3000},
                                                   {"<- attach_tail", 3000},
                                                   {"@ attach_point", 3}}));
    EXPECT_EQ(point_args, (std::multiset<std::string>{"(4660, 18446744073709551611, 0, 9223372036854775807)",
                                                      "(4660, 18446744073709551611, 1, 9223372036854775807)",
                                                      "(4660, 18446744073709551611, 2, 9223372036854775807)"}));
    EXPECT_NE(file_text(dir / "out").find("total=9000"), std::string::npos);  // same result as unprobed

    must(run({bin("iprobe"), "detach", pid}));
}

// ----------------------------------------------------------------- install

// `cmake --install` gives other builds the header, the plugin and the
// wrapper through a CMake package and a (relocatable) pkg-config file.
TEST(LlvmPassInstall, PackageServesCMakeAndPkgConfigBuilds) {
    TempDir dir;
    const std::string prefix = dir / "prefix";
    must(run({"cmake", "--install", build_dir(), "--prefix", prefix}, {}, std::chrono::seconds(120)));
    for (const char* file : {"include/iprobe/iprobe.h", "include/iprobe/formats/probe_list.h", "lib/IProbePass.so",
                             "lib/cmake/iprobe/iprobeConfig.cmake", "lib/cmake/iprobe/iprobeConfigVersion.cmake",
                             "lib/pkgconfig/iprobe.pc", "bin/iprobe-cc", "bin/iprobe"})
        EXPECT_TRUE(std::filesystem::exists(prefix + "/" + file)) << file;

    // CMake: find_package, and the installed wrapper finds the installed plugin.
    const std::string consumer = dir / "consumer";
    must(run({"cmake", "-S", data("consumer"), "-B", consumer, "-DCMAKE_PREFIX_PATH=" + prefix,
              "-DCMAKE_C_COMPILER=" + prefix + "/bin/iprobe-cc"},
             {}, std::chrono::seconds(120), {"IPROBE_MODE=llvm", "IPROBE_PASS_PLUGIN="}));
    must(run({"cmake", "--build", consumer}, {}, std::chrono::seconds(120), {"IPROBE_MODE=llvm", "IPROBE_PASS_PLUGIN="}));
    EXPECT_EQ(file_text(consumer + "/iprobe-vars.txt"),
              prefix + "/lib/IProbePass.so\n" + prefix + "/bin/iprobe-cc\nTRUE\n");
    EXPECT_EQ(run({consumer + "/app"}).out, "42\n");
    const probelist::ProbeList list = probelist::load_probes(consumer + "/app");
    EXPECT_EQ(count_by_function(list, probelist::ProbeKind::entry), (std::map<std::string, int>{{"main", 1}, {"twice", 1}}));
    EXPECT_EQ(count_by_function(list, probelist::ProbeKind::point), (std::map<std::string, int>{{"consumer_twice", 1}}));

    // pkg-config, from wherever the prefix was installed.
    const std::vector<std::string> env = {"PKG_CONFIG_PATH=" + prefix + "/lib/pkgconfig"};
    const auto cflags = run({"pkg-config", "--cflags", "iprobe"}, {}, std::chrono::seconds(30), env);
    must(cflags);
    const auto plugin_path = run({"pkg-config", "--variable=pass_plugin", "iprobe"}, {}, std::chrono::seconds(30), env);
    must(plugin_path);
    EXPECT_TRUE(std::filesystem::equivalent(plugin_path.out.substr(0, plugin_path.out.find('\n')),
                                            prefix + "/lib/IProbePass.so"))
        << plugin_path.out;
    const std::string app = dir / "app-pc";
    std::string flags = cflags.out.substr(0, cflags.out.find('\n'));
    must(sh("gcc -O2 " + flags + " '" + data("consumer/app.c") + "' -o '" + app + "'"));
    EXPECT_EQ(run({app}).out, "42\n");
}

// ------------------------------------------------------------------- redis

// Replies of one redis-server to a fixed command set (no set iteration
// order, no timing: identical for identical behaviour).
std::string redis_session(const std::string& server) {
    TempDir dir;
    const int port = free_port();
    Child child({server, "--port", std::to_string(port), "--save", "", "--appendonly", "no", "--dir", dir.path()},
                dir / "server.log");
    EXPECT_TRUE(wait_for_port(port)) << file_text(dir / "server.log");
    const std::string commands =
        "PING\nECHO iprobe\nSET k1 hello\nGET k1\nAPPEND k1 -world\nSTRLEN k1\nGETRANGE k1 2 7\n"
        "SETRANGE k1 0 J\nGET k1\nINCR n\nINCRBY n 41\nDECR n\nINCRBYFLOAT f 2.5\nMSET a 1 b 2 c 3\n"
        "MGET a b c missing\nLPUSH l x y z\nRPUSH l w\nLRANGE l 0 -1\nLPOP l\nLLEN l\n"
        "HSET h f1 v1 f2 v2\nHGET h f2\nHLEN h\nHINCRBY h n 5\nZADD z 3 c 1 a 2 b\nZRANGE z 0 -1 WITHSCORES\n"
        "ZSCORE z b\nZRANK z c\nSADD s m1 m2 m3 m2\nSCARD s\nSISMEMBER s m2\nSREM s m1\nSCARD s\n"
        "EXPIRE k1 1000\nTTL k1\nPERSIST k1\nTTL k1\nTYPE h\nOBJECT ENCODING l\nEXISTS a b nope\nDEL a b\n"
        "DBSIZE\nEVAL \"return redis.call('get', KEYS[1])\" 1 k1\nGET l\nNOSUCHCOMMAND\nSORT l ALPHA\n"
        "SETBIT bits 7 1\nBITCOUNT bits\nPFADD hll a b c d\nPFCOUNT hll\nFLUSHALL\nDBSIZE\n";
    const auto replies = run({"redis-cli", "-p", std::to_string(port)}, commands);
    EXPECT_EQ(replies.exit_code, 0) << describe(replies);
    return replies.out;
}

TEST(LlvmPassRedis, RepliesAsNative) {
    const std::string native = build_redis("native");
    const std::string llvm = build_redis("llvm");
    ASSERT_FALSE(native.empty() || llvm.empty());
    const std::string expected = redis_session(native);
    ASSERT_NE(expected.find("Jello-world"), std::string::npos) << expected;
    EXPECT_EQ(redis_session(llvm), expected);

    const probelist::ProbeList list = probelist::load_probes(llvm);
    const auto entries = count_by_function(list, probelist::ProbeKind::entry);
    EXPECT_GT(entries.size(), 2000u);
    for (const char* function : {"processCommand", "call", "setCommand", "getCommand", "main"})
        EXPECT_EQ(entries.count(function), 1u) << function;
}

}  // namespace
}  // namespace iprobe::test
