// A first attach stops the target twice (hotpatch.cpp,
// prepare_in_stop): a short stop injects the runtime and maps its region and
// stub areas, the sites are planned while the target runs, a second stop
// writes them.  On many_target (512 functions, targets/many_target.c).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "hotpatch_fixture.h"
#include "iprobe/hotpatch/hotpatch.h"
#include "iprobe/support/error.h"

namespace iprobe::test {
namespace {

using nlohmann::json;

constexpr int kFunctions = 512;
constexpr int kThreads = 4;
const std::string kBinary = "/many_target";

std::string many_target() { return targets_dir() + kBinary; }

// How many of many_000 .. many_777 `report --json` shows called exactly `calls` times.
int functions_called(const std::string& report, long long calls) {
    int exact = 0;
    for (int i = 0; i < kFunctions; i++) {
        char name[16];
        std::snprintf(name, sizeof name, "many_%o%o%o", i / 64, i / 8 % 8, i % 8);
        exact += json_calls(report, name) == calls;
    }
    return exact;
}

std::string report_of(const std::string& pid) {
    const auto r = iprobe({"report", pid, "--json"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.out;
}

std::uint64_t field(const json& j, const char* name) { return j.at(name).get<std::uint64_t>(); }

// The runtime library next to the iprobe being tested (build/lib).
std::string runtime_library() {
    return (std::filesystem::path(iprobe_bin()).parent_path().parent_path() / "lib" / "libiprobe-rt.so").string();
}

TEST(PrepareStop, AFirstAttachOfManySitesPlansThemWhileTheTargetRunsAndCountsExactly) {
    HpTarget t(kThreads, many_target());
    const std::string pid = std::to_string(t.pid());
    const auto before = text_of(t.pid(), kBinary);
    auto r = iprobe({"attach", pid, "--handler", "count", "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json a = json::parse(r.out);
    EXPECT_TRUE(a["runtime_injected"].get<bool>()) << r.out;
    EXPECT_TRUE(a["planned_while_running"].get<bool>()) << r.out;
    EXPECT_GT(field(a, "prepare_pause_us"), 0u) << r.out;
    EXPECT_GT(field(a, "write_pause_us"), 0u) << r.out;
    EXPECT_EQ(field(a, "pause_us"), std::max(field(a, "prepare_pause_us"), field(a, "write_pause_us"))) << r.out;
    EXPECT_EQ(field(a, "threads"), static_cast<std::uint64_t>(kThreads + 1)) << r.out;
    EXPECT_GE(field(a, "selected"), static_cast<std::uint64_t>(kFunctions)) << r.out;
    EXPECT_EQ(field(a, "enabled"), field(a, "selected")) << r.out;
    EXPECT_EQ(field(a, "total_enabled"), field(a, "selected")) << r.out;

    EXPECT_EQ(t.command("calls 1000"), 1000);
    EXPECT_EQ(functions_called(report_of(pid), 1000), kFunctions);

    r = iprobe({"detach", pid, "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(field(json::parse(r.out), "disabled"), field(a, "selected")) << r.out;
    EXPECT_EQ(text_of(t.pid(), kBinary), before);
    EXPECT_EQ(t.command("calls 10"), 10);
}

// A few sites too: one stop would also read the maps and check the sites
// inside it (the pause of two stops is shorter even for 8 probes).
TEST(PrepareStop, AFewSitesArePlannedBetweenTwoStopsToo) {
    HpTarget t(kThreads, many_target());
    const std::string pid = std::to_string(t.pid());
    auto r = iprobe({"attach", pid, "--handler", "count", "--functions", "many_00*", "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json a = json::parse(r.out);
    EXPECT_EQ(field(a, "enabled"), 8u) << r.out;
    EXPECT_TRUE(a["runtime_injected"].get<bool>()) << r.out;
    EXPECT_TRUE(a["planned_while_running"].get<bool>()) << r.out;
    EXPECT_GT(field(a, "prepare_pause_us"), 0u) << r.out;
    EXPECT_EQ(field(a, "pause_us"), std::max(field(a, "prepare_pause_us"), field(a, "write_pause_us"))) << r.out;
    EXPECT_EQ(t.command("calls 7"), 7);
    const std::string report = report_of(pid);
    EXPECT_EQ(json_calls(report, "many_000"), 7);
    EXPECT_EQ(json_calls(report, "many_007"), 7);
    EXPECT_EQ(json_calls(report, "many_010"), -1) << "not selected";
}

// A second attach needs no preparation: one stop.
TEST(PrepareStop, ASecondAttachMakesOneStop) {
    HpTarget t(kThreads, many_target());
    const std::string pid = std::to_string(t.pid());
    auto r = iprobe({"attach", pid, "--handler", "count", "--functions", "many_00*"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    r = iprobe({"attach", pid, "--handler", "count", "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json a = json::parse(r.out);
    EXPECT_FALSE(a["runtime_injected"].get<bool>()) << r.out;
    EXPECT_TRUE(a["planned_while_running"].get<bool>()) << r.out;
    EXPECT_EQ(field(a, "prepare_pause_us"), 0u) << r.out;
    EXPECT_EQ(field(a, "write_pause_us"), field(a, "pause_us")) << r.out;
    EXPECT_EQ(field(a, "already_enabled"), 8u) << r.out;
    EXPECT_EQ(field(a, "enabled") + 8, field(a, "selected")) << r.out;
    EXPECT_EQ(t.command("calls 3"), 3);
    EXPECT_EQ(functions_called(report_of(pid), 3), kFunctions);
}

// Interrupted after its preparation stop (as by Ctrl-C there): the target
// runs on with its code untouched and the runtime inert, as the error says;
// detach finds nothing to undo, and the next attach uses the region and
// stub areas the preparation made (one stop, planned while it ran).
TEST(PrepareStop, InterruptedBetweenItsStopsTheTargetRunsOnAndTheNextAttachWorks) {
    HpTarget t(kThreads, many_target());
    const std::string pid = std::to_string(t.pid());
    const auto before = text_of(t.pid(), kBinary);
    hotpatch::AttachOptions o;
    o.pid = t.pid();
    o.mode = hotpatch::HandlerMode::count;
    o.runtime_library = runtime_library();
    bool between = false;
    o.between_stops = [&] {
        between = true;
        hotpatch::interrupt();
    };
    try {
        hotpatch::attach(o);
        ADD_FAILURE() << "the attach was interrupted";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ExitCode::interrupted) << e.what();
        EXPECT_NE(std::string(e.what()).find("stays in the process, inert"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(between);
    EXPECT_TRUE(t.child().running());
    EXPECT_EQ(text_of(t.pid(), kBinary), before);
    EXPECT_EQ(t.command("calls 10"), 10);
    auto r = iprobe({"status", pid});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("runtime loaded"), std::string::npos) << r.out;

    r = iprobe({"detach", pid, "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(field(json::parse(r.out), "disabled"), 0u) << r.out;
    EXPECT_EQ(field(json::parse(r.out), "sites_restored"), 0u) << r.out;
    EXPECT_EQ(text_of(t.pid(), kBinary), before);

    r = iprobe({"attach", pid, "--handler", "count", "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json a = json::parse(r.out);
    EXPECT_FALSE(a["runtime_injected"].get<bool>()) << r.out;
    EXPECT_TRUE(a["planned_while_running"].get<bool>()) << r.out;
    EXPECT_EQ(field(a, "prepare_pause_us"), 0u) << "the preparation was done: " << r.out;
    EXPECT_EQ(field(a, "enabled"), field(a, "selected")) << r.out;
    EXPECT_EQ(t.command("calls 100"), 100);
    EXPECT_EQ(functions_called(report_of(pid), 100), kFunctions);
    r = iprobe({"detach", pid});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(text_of(t.pid(), kBinary), before);
}

// The files mapped change between the stops (a dlopen after the plan was
// made): the plan is not used, the second stop plans again, counts are exact.
TEST(PrepareStop, MapsChangedBetweenItsStopsTheSecondPlansAgain) {
    HpTarget t(kThreads, many_target());
    const std::string pid = std::to_string(t.pid());
    const auto before = text_of(t.pid(), kBinary);
    ASSERT_EQ(file_text("/proc/" + pid + "/maps").find("/libm.so"), std::string::npos) << "libm is loaded already";
    hotpatch::AttachOptions o;
    o.pid = t.pid();
    o.mode = hotpatch::HandlerMode::count;
    o.runtime_library = runtime_library();
    o.between_stops = [&] { EXPECT_EQ(t.command("dlopen 0"), 1); };
    const hotpatch::AttachStats st = hotpatch::attach(o);
    EXPECT_NE(file_text("/proc/" + pid + "/maps").find("/libm.so"), std::string::npos);
    EXPECT_FALSE(st.planned_while_running) << "a plan made before the dlopen was used";
    EXPECT_GT(st.prepare_pause_us, 0u);
    EXPECT_TRUE(st.runtime_injected);
    EXPECT_GE(st.selected, static_cast<std::size_t>(kFunctions));
    EXPECT_EQ(st.enabled, st.selected);
    EXPECT_EQ(t.command("calls 100"), 100);
    EXPECT_EQ(functions_called(report_of(pid), 100), kFunctions);
    const auto r = iprobe({"detach", pid});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(text_of(t.pid(), kBinary), before);
}

}  // namespace
}  // namespace iprobe::test
