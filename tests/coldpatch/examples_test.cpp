// The examples, built by examples/CMakeLists.txt natively and with iprobe-cc
// in its default flow (entry) and in the finstrument flow, behave
// identically; the coldpatched builds list as many probes as the compiler
// emitted placeholders (finstrument: and hold no hook call).
#include <gtest/gtest.h>

#include <functional>
#include <thread>

#include "binary_checks.h"
#include "iprobe/probelist/probe_list.h"
#include "testutil.h"

namespace iprobe::test {
namespace {

std::string example(const std::string& name, const std::string& flavour) {
    return build_dir() + "/examples/" + name + "/" + flavour + "/" + name;
}

// Runs a binary with some workload; `env` must reach its environment.
using Workload = std::function<void(const std::string& binary, const std::vector<std::string>& env)>;

// The compile of examples/CMakeLists.txt for `flow`, without the coldpatch:
// what the compiler emitted.
std::string unpatched_build(const TempDir& dir, const std::string& name, const std::string& flow,
                            const std::string& source, const std::string& wrapper, const std::string& std,
                            const std::string& libs) {
    const std::string unpatched = dir / name;
    // The same command and directory as examples/CMakeLists.txt.
    const auto r = sh("cd " + build_dir() + "/examples/" + name + " && IPROBE_COLDPATCH=0 " + bin(wrapper) +
                      " --flow=" + flow + " " + std + " -O2 -g -Wall -Wextra -Werror " + source_dir() + "/examples/" +
                      source + " -o " + unpatched + " " + libs);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return unpatched;
}

// The default (entry flow) build: each function's pad became one NOP and
// lists an entry and an exit; nothing else changed.
void expect_entry_flow(const std::string& name, const std::string& source, const std::string& wrapper,
                       const std::string& std, const std::string& libs) {
    const std::string binary = example(name, "iprobe");
    const probelist::ProbeList list = probelist::ProbeList::load(binary + ".probes");
    EXPECT_EQ(list.flow, static_cast<std::uint32_t>(IPROBE_FLOW_PATCHABLE_ENTRY));
    TempDir dir;
    const std::string unpatched = unpatched_build(dir, name, "entry", source, wrapper, std, libs);
    std::size_t entries = 0;
    for (std::size_t i = 0; i < list.probes.size(); i++)
        if (list.probes[i].kind == probelist::ProbeKind::entry) {
            ++entries;
            EXPECT_TRUE(probelist::serves_returns(list.probes, i)) << list.probes[i].function;
        }
    EXPECT_GT(entries, 0u);
    EXPECT_EQ(list.probes.size(), 2 * entries);
    expect_only_sites_changed(unpatched, binary, list);
}

// Checks the finstrument build of an example against the same compile
// without the coldpatch: only the sites differ, one probe per hook call, no
// call left, and at run time each hook call site that executes names the
// function the compiler passed to the hook.
void expect_coldpatched(const std::string& name, const std::string& source, const std::string& wrapper,
                        const std::string& std, const std::string& libs, const Workload& workload) {
    const std::string binary = example(name, "finstrument");
    const probelist::ProbeList list = probelist::ProbeList::load(binary + ".probes");
    TempDir dir;
    const std::string unpatched = unpatched_build(dir, name, "finstrument", source, wrapper, std, libs);
    const HookCalls emitted = count_hook_calls(unpatched);
    EXPECT_GT(emitted.total(), 0);
    EXPECT_EQ(list.probes.size(), static_cast<std::size_t>(emitted.total()));
    std::size_t entries = 0;
    for (const auto& p : list.probes) entries += p.kind == probelist::ProbeKind::entry;
    EXPECT_EQ(entries, static_cast<std::size_t>(emitted.enter));
    const HookCalls left = count_hook_calls(binary);
    EXPECT_EQ(left.total(), 0);
    EXPECT_EQ(left.tail_jumps, 0);
    expect_only_sites_changed(unpatched, binary, list);

    const std::string log = dir / "hooks.log";
    workload(unpatched, recorder_env(log));
    const RecordedCheck recorded = check_recorded(log, list);
    EXPECT_GE(recorded.sites, 4u) << "the workload ran instrumented code";
    for (const auto& problem : recorded.problems) ADD_FAILURE() << problem;
    for (const auto& problem : recorded.misnamed) ADD_FAILURE() << problem;
}

TEST(Examples, ShapesPrintsTheSame) {
    const auto native = run({example("shapes", "native")});
    ASSERT_EQ(native.exit_code, 0);
    EXPECT_NE(native.out.find("caught: mean of nothing"), std::string::npos);
    const auto more_native = run({example("shapes", "native"), "40"});
    for (const char* flavour : {"iprobe", "finstrument"}) {
        const auto probed = run({example("shapes", flavour)});
        EXPECT_EQ(probed.exit_code, 0) << flavour;
        EXPECT_EQ(probed.out, native.out) << flavour;
        EXPECT_EQ(run({example("shapes", flavour), "40"}).out, more_native.out) << flavour;
    }
    expect_entry_flow("shapes", "shapes/shapes.cpp", "iprobe-c++", "-std=c++20", "");
    expect_coldpatched("shapes", "shapes/shapes.cpp", "iprobe-c++", "-std=c++20", "",
                       [](const std::string& b, const std::vector<std::string>& env) {
                           EXPECT_EQ(run({b, "40"}, {}, std::chrono::seconds(60), env).exit_code, 0);
                       });
    const auto demangled = run({bin("iprobe"), "list", example("shapes", "finstrument"), "--count", "--functions",
                                "geometry::Triangle::area() const"});
    EXPECT_GE(std::stoi(demangled.out), 2) << "entry and exit, plus copies inlined elsewhere";
    EXPECT_EQ(run({bin("iprobe"), "list", example("shapes", "iprobe"), "--count", "--functions",
                   "geometry::Triangle::area() const"})
                  .out,
              "2\n")
        << "entry flow: the out-of-line function's entry and exit only";
}

TEST(Examples, MicrobenchRunsTheSame) {
    for (const char* flavour : {"native", "iprobe", "finstrument"}) {
        const auto r = run({example("microbench", flavour), "1000"});
        EXPECT_EQ(r.exit_code, 0);
        EXPECT_EQ(r.out.rfind("calls=1000 total_ns=", 0), 0u) << r.out;
        EXPECT_EQ(run({example("microbench", flavour)}).exit_code, 2);
    }
    expect_entry_flow("microbench", "microbench/microbench.c", "iprobe-cc", "-std=gnu11", "");
    expect_coldpatched("microbench", "microbench/microbench.c", "iprobe-cc", "-std=gnu11", "",
                       [](const std::string& b, const std::vector<std::string>& env) {
                           EXPECT_EQ(run({b, "10"}, {}, std::chrono::seconds(60), env).exit_code, 0);
                       });
    for (const char* flavour : {"iprobe", "finstrument"})
        EXPECT_EQ(run({bin("iprobe"), "list", example("microbench", flavour), "--count", "--functions", "empty_function"})
                      .out,
                  "2\n")
            << flavour << ": its entry and its exit";
}

// One client session against a running echo-service; returns all replies.
std::string session(int port, const std::string& requests) {
    const auto r = run({"bash", "-c",
                        "exec 3<>/dev/tcp/127.0.0.1/" + std::to_string(port) + " && printf '" + requests +
                            "' >&3 && timeout 10 cat <&3"});
    return r.out;
}

std::string run_echo_service(const std::string& binary, std::string& final_output,
                             const std::vector<std::string>& env = {}) {
    TempDir dir;
    const int port = free_port();
    Child service({binary, "--port", std::to_string(port), "--threads", "3"}, dir / "out.txt", env);
    EXPECT_TRUE(wait_for_port(port)) << binary;  // one connection, counted by the service
    std::string replies;
    replies += session(port, "ECHO hello world\\nUPPER mixed Case\\nREV abcdef\\nSUM 1 2 3 -4\\nNOPE\\nQUIT\\n");
    // Several concurrent clients, each served by a worker thread.
    std::vector<std::thread> clients;
    std::vector<std::string> parallel(4);
    for (int i = 0; i < 4; ++i)
        clients.emplace_back([&, i] { parallel[i] = session(port, "ECHO client " + std::to_string(i) + "\\nQUIT\\n"); });
    for (auto& t : clients) t.join();
    for (const auto& p : parallel) replies += p;
    replies += session(port, "STATS\\nSHUTDOWN\\n");
    EXPECT_EQ(service.wait(std::chrono::seconds(10)), 0) << "clean shutdown";
    final_output = file_text(dir / "out.txt");
    final_output = final_output.substr(final_output.find('\n') + 1);  // the first line names the port
    return replies;
}

TEST(Examples, EchoServiceRepliesTheSame) {
    std::string native_tail;
    const std::string native = run_echo_service(example("echo-service", "native"), native_tail);
    EXPECT_EQ(native.substr(0, 56), "hello world\nMIXED CASE\nfedcba\n2\nERR unknown command\nbye\n");
    EXPECT_NE(native.find("connections=7 requests=15\nbye\n"), std::string::npos) << native;
    EXPECT_EQ(native_tail, "echo-service stopped: 7 connections, 16 requests\n");
    for (const char* flavour : {"iprobe", "finstrument"}) {
        std::string probed_tail;
        EXPECT_EQ(run_echo_service(example("echo-service", flavour), probed_tail), native) << flavour;
        EXPECT_EQ(probed_tail, native_tail) << flavour;
    }
    expect_entry_flow("echo-service", "echo-service/echo_service.c", "iprobe-cc", "-std=gnu11", "-pthread");
    expect_coldpatched("echo-service", "echo-service/echo_service.c", "iprobe-cc", "-std=gnu11", "-pthread",
                       [&](const std::string& b, const std::vector<std::string>& env) {
                           std::string tail;
                           EXPECT_EQ(run_echo_service(b, tail, env), native);
                       });
}

}  // namespace
}  // namespace iprobe::test
