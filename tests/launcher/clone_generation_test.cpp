// The clones of a debug session on their own (clone_generation.h), without
// a mirror: how the selected functions are shared out among N clones, and
// real generations of clones restored from checkpoints of a real
// redis-server, each reachable at the address the mirror would be given,
// probed through its one agent, reported and removed without a trace.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "iprobe/launcher/clone.h"
#include "iprobe/launcher/clone_generation.h"
#include "iprobe/support/fd.h"
#include "redis_fixture.h"

namespace fs = std::filesystem;
using namespace iprobe;
using namespace iprobe::launcher;
using namespace iprobe::test;

namespace {

using Shares = std::vector<std::vector<std::string>>;

TEST(ShareFunctions, WithoutCostsTheyAreDealtOutInListOrder) {
    EXPECT_EQ(share_functions({"a", "b", "c", "d", "e"}, 2, {}), (Shares{{"a", "c", "e"}, {"b", "d"}}));
    EXPECT_EQ(share_functions({"a", "b", "c"}, 1, {{"a", 9.0}}), (Shares{{"a", "b", "c"}}));
    EXPECT_EQ(share_functions({"a"}, 3, {}), (Shares{{"a"}, {}, {}}));
    EXPECT_EQ(share_functions({}, 2, {}), (Shares{{}, {}}));
}

TEST(ShareFunctions, WithCostsTheCostliestGoesToTheClonesCarryingLeast) {
    // b 5, c 2, d 2, a 1, e 0 (unmeasured): b to clone 1; c, d and a to
    // clone 2 (2, 4, 5); e to the first of two equal loads.
    const std::map<std::string, double> cost = {{"a", 1}, {"b", 5}, {"c", 2}, {"d", 2}};
    EXPECT_EQ(share_functions({"a", "b", "c", "d", "e"}, 2, cost), (Shares{{"b", "e"}, {"c", "d", "a"}}));
    EXPECT_EQ(share_functions({"a", "b", "c", "d"}, 3, cost), (Shares{{"b"}, {"c", "a"}, {"d"}}));
}

std::vector<nlohmann::json> events_of(const std::string& out, const std::string& kind) {
    std::vector<nlohmann::json> found;
    std::istringstream lines(out);
    for (std::string line; std::getline(lines, line);) {
        const auto doc = nlohmann::json::parse(line, nullptr, false);
        if (doc.is_object() && doc.value("event", "") == kind) found.push_back(doc);
    }
    return found;
}

// redis-cli from this (the host's) network namespace, as the mirror connects.
std::string cli_at(const std::string& address, const std::vector<std::string>& args) {
    const auto colon = address.rfind(':');
    std::vector<std::string> argv = {"redis-cli", "-h", address.substr(0, colon), "-p", address.substr(colon + 1)};
    argv.insert(argv.end(), args.begin(), args.end());
    return trim(run(argv, {}, std::chrono::seconds(30)).out);
}

class CloneGenerationTest : public ::testing::Test {
protected:
    void SetUp() override {
        IPROBE_SKIP_UNLESS_CLONING_WORKS();
        prod_ns_ = std::make_unique<Netns>("ipt-gprod-" + std::to_string(getpid()));
        name_ = "ipt-gen-" + std::to_string(getpid());
        port_ = free_port();
        int lifeline[2];
        ASSERT_EQ(::pipe2(lifeline, O_CLOEXEC), 0);
        lifeline_read_.reset(lifeline[0]);
        lifeline_write_.reset(lifeline[1]);
    }
    void TearDown() override {
        if (!is_root()) return;
        for (const auto& n : {name_, name_ + "-2"}) run({bin("iprobe"), "clone", "--destroy", n});
        redis_.reset();
        prod_ns_.reset();
    }
    void start_redis(const std::string& binary = "/usr/bin/redis-server") {
        redis_ = std::make_unique<Redis>(prod_ns_->path(), port_, dir_.path(), binary);
        ASSERT_TRUE(redis_->ready()) << "redis-server did not start";
    }
    DebugOptions options(int clones) const {
        DebugOptions o;
        o.pid = redis_->pid();
        o.production = "127.0.0.1:" + std::to_string(port_);
        o.clones = clones;
        o.trace = false;
        o.json = true;
        return o;
    }
    CloneSetup setup(const std::string& hotpatch_tool = "") const {
        return {name_, "127.0.0.1", port_, hotpatch_tool, {}, lifeline_read_.get(), std::chrono::steady_clock::now()};
    }
    Checkpoint checkpoint(const std::string& dir) {
        CloneOptions co;
        co.pid = redis_->pid();
        co.name = name_;
        return take_checkpoint(co, dir);
    }
    void expect_no_trace_of(const std::string& name) {
        EXPECT_FALSE(netns_exists(name)) << name;
        EXPECT_FALSE(fs::exists("/run/iprobe/clones/" + name)) << name;
    }

    TempDir dir_;          // production's working directory
    TempDir checkpoints_;  // not inside it: each checkpoint copies it
    std::unique_ptr<Netns> prod_ns_;
    std::string name_;
    int port_ = 0;
    std::unique_ptr<Redis> redis_;
    UniqueFd lifeline_read_, lifeline_write_;
};

}  // namespace

TEST_F(CloneGenerationTest, EachGenerationRestoresEveryCloneAtItsAddressAndEndsWithoutATrace) {
    ASSERT_NO_FATAL_FAILURE(start_redis());
    ASSERT_EQ(redis_->cli({"SET", "marker", "one"}), "OK");
    {
        CloneGeneration clones(options(2), setup(), SessionEvents(true, "iprobe debug"));
        clones.select_probes();  // nothing to probe: nothing selected, nothing measured
        const std::vector<std::string> addresses = clones.debug_addresses();
        ASSERT_EQ(addresses.size(), 2u);
        EXPECT_NE(addresses[0], addresses[1]);
        for (const auto& a : addresses) {
            EXPECT_EQ(a.rfind("10.213.", 0), 0u) << a;
            EXPECT_EQ(a.substr(a.rfind(':') + 1), std::to_string(port_)) << a;
        }

        clones.begin();
        const Checkpoint first = checkpoint(checkpoints_ / "cp1");
        ::testing::internal::CaptureStdout();
        clones.restore(first, false, -1);
        const std::string said = ::testing::internal::GetCapturedStdout();
        EXPECT_EQ(clones.number(), 1);
        const auto made = events_of(said, "clone");
        ASSERT_EQ(made.size(), 2u) << said;
        EXPECT_EQ(made[0].value("name", ""), name_);
        EXPECT_EQ(made[1].value("name", ""), name_ + "-2");
        for (std::size_t i = 0; i < 2; ++i) {
            EXPECT_EQ(made[i].value("generation", 0), 1);
            EXPECT_EQ(made[i].value("debug_address", ""), addresses[i]);
        }
        EXPECT_TRUE(clones.agent_fds().empty()) << "an agent started with nothing to probe or patch";
        // Each clone answers with production's data at its address, and is its own.
        EXPECT_EQ(cli_at(addresses[0], {"GET", "marker"}), "one");
        EXPECT_EQ(cli_at(addresses[1], {"GET", "marker"}), "one");
        EXPECT_EQ(cli_at(addresses[0], {"SET", "marker", "clone-1"}), "OK");
        EXPECT_EQ(cli_at(addresses[1], {"GET", "marker"}), "one");
        EXPECT_EQ(redis_->cli({"GET", "marker"}), "one");
        EXPECT_EQ(clones.pump(), "");

        ::testing::internal::CaptureStdout();
        clones.end();
        EXPECT_EQ(::testing::internal::GetCapturedStdout(), "") << "a report without probes";
        expect_no_trace_of(name_);
        expect_no_trace_of(name_ + "-2");
        EXPECT_EQ(redis_->cli({"GET", "marker"}), "one");

        // The next generation: production's state now, at the same addresses.
        ASSERT_EQ(redis_->cli({"SET", "marker", "two"}), "OK");
        clones.begin();
        const Checkpoint second = checkpoint(checkpoints_ / "cp2");
        ::testing::internal::CaptureStdout();
        clones.restore(second, false, -1);
        const auto remade = events_of(::testing::internal::GetCapturedStdout(), "clone");
        ASSERT_EQ(remade.size(), 2u);
        EXPECT_EQ(remade[1].value("generation", 0), 2);
        EXPECT_EQ(clones.number(), 2);
        EXPECT_EQ(clones.debug_addresses(), addresses);
        EXPECT_EQ(cli_at(addresses[0], {"GET", "marker"}), "two");
        EXPECT_EQ(cli_at(addresses[1], {"GET", "marker"}), "two");
    }  // destroyed: the clones go with it
    expect_no_trace_of(name_);
    expect_no_trace_of(name_ + "-2");
    EXPECT_EQ(redis_->cli({"PING"}), "PONG");
}

TEST_F(CloneGenerationTest, TwoClonesProbeOneShareEachThroughTheirAgentsAndTheReportMergesThem) {
    const std::string server = finstrument_redis();
    ASSERT_FALSE(server.empty()) << "scripts/build-redis --mode finstrument failed";
    ASSERT_NO_FATAL_FAILURE(start_redis(server));
    DebugOptions o = options(2);
    o.probes = server + ".probes";
    o.functions = "setCommand,getCommand";
    CloneGeneration clones(o, setup(build_dir() + "/libexec/iprobe/iprobe-hotpatch"), SessionEvents(true, "iprobe debug"));
    ::testing::internal::CaptureStdout();
    clones.select_probes();
    const auto cost = events_of(::testing::internal::GetCapturedStdout(), "probe-cost");
    ASSERT_EQ(cost.size(), 1u);
    EXPECT_EQ(cost[0].value("functions", 0), 2);

    clones.begin();
    const Checkpoint cp = checkpoint(checkpoints_ / "cp");
    ::testing::internal::CaptureStdout();
    clones.restore(cp, false, -1);
    const auto attached = events_of(::testing::internal::GetCapturedStdout(), "attached");
    ASSERT_EQ(attached.size(), 2u);
    std::set<std::string> probed;
    for (const auto& a : attached) {
        EXPECT_EQ(a.value("function_count", 0), 1) << a.dump();
        ASSERT_EQ(a.at("functions").size(), 1u);
        probed.insert(a.at("functions")[0].get<std::string>());
    }
    EXPECT_EQ(probed, (std::set<std::string>{"setCommand", "getCommand"}));
    EXPECT_EQ(clones.agent_fds().size(), 2u);

    // The same commands to both clones: each counts only its own share.
    const auto addresses = clones.debug_addresses();
    for (const auto& a : addresses) {
        EXPECT_EQ(cli_at(a, {"SET", "k", "v"}), "OK");
        EXPECT_EQ(cli_at(a, {"GET", "k"}), "v");
        EXPECT_EQ(cli_at(a, {"GET", "k"}), "v");
    }
    EXPECT_EQ(clones.pump(), "");
    ::testing::internal::CaptureStdout();
    clones.report();
    const auto reports = events_of(::testing::internal::GetCapturedStdout(), "report");
    ASSERT_EQ(reports.size(), 1u);
    std::map<std::string, std::pair<std::uint64_t, int>> rows;  // calls, clone
    for (const auto& row : reports[0].at("functions"))
        rows[row.at("name").get<std::string>()] = {row.at("calls").get<std::uint64_t>(), row.at("clone").get<int>()};
    ASSERT_EQ(rows.size(), 2u) << reports[0].dump();
    EXPECT_EQ(rows["setCommand"].first, 1u);
    EXPECT_EQ(rows["getCommand"].first, 2u);
    EXPECT_NE(rows["setCommand"].second, rows["getCommand"].second);
    EXPECT_EQ(reports[0].value("generation", 0), 1);
    clones.remove();
    expect_no_trace_of(name_);
    expect_no_trace_of(name_ + "-2");
    // Production was never probed: no runtime loaded into it.
    EXPECT_EQ(file_text("/proc/" + std::to_string(redis_->pid()) + "/maps").find("libiprobe-rt"), std::string::npos);
}
