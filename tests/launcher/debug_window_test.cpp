// The debug window, managed (docs/debug-window.md): `iprobe debug --adapt`
// against the same load with and without it, retro-logging with `--record`
// and `iprobe investigate`, and `--clones N`.  A real redis-server built with
// iprobe-cc is production, in a network namespace of its own.  Needs root.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <map>
#include <set>
#include <sstream>

#include "redis_fixture.h"

namespace fs = std::filesystem;
using namespace iprobe::test;
using Json = nlohmann::json;

namespace {

Json parse(const std::string& line) { return Json::parse(line, nullptr, false); }

class DebugWindow : public ::testing::Test {
protected:
    void SetUp() override {
        IPROBE_SKIP_UNLESS_CLONING_WORKS();
        for (const char* tool : {"iprobe-mirror", "iprobe-hotpatch", "iprobe-probe-cost"})
            if (!fs::exists(build_dir() + "/libexec/iprobe/" + tool)) FAIL() << tool << " is not built";
        server_ = finstrument_redis();
        ASSERT_FALSE(server_.empty()) << "scripts/build-redis --mode finstrument failed";
        prod_ns_ = std::make_unique<Netns>("ipt-dwin-" + std::to_string(getpid()));
        port_ = free_port();
        listen_port_ = free_port();
        while (listen_port_ == port_) listen_port_ = free_port();
        redis_ = std::make_unique<Redis>(prod_ns_->path(), port_, dir_.path(), server_);
        ASSERT_TRUE(redis_->ready()) << "redis-server did not start";
    }
    void TearDown() override {
        if (session_) {
            session_->kill(SIGTERM);
            session_->wait(std::chrono::seconds(60));
        }
        session_.reset();
        redis_.reset();
        prod_ns_.reset();
    }
    // `iprobe debug` of production with --json and `extra`; returns once
    // the mirror listens.
    void start_session(const std::string& out, const std::vector<std::string>& extra) {
        out_ = dir_ / out;
        std::vector<std::string> argv = {"nsenter", "--net=" + prod_ns_->path(), bin("iprobe"), "debug",
                                         std::to_string(redis_->pid()), "--listen",
                                         "127.0.0.1:" + std::to_string(listen_port_), "--production",
                                         "127.0.0.1:" + std::to_string(port_), "--json"};
        argv.insert(argv.end(), extra.begin(), extra.end());
        session_ = std::make_unique<Child>(argv, out_);
        ASSERT_TRUE(wait_for_event(out_, "mirror", 1, *session_, std::chrono::seconds(120))) << file_text(out_);
    }
    // Stops the session; its last event, with the mirror's final stats.
    Json stop_session() {
        session_->kill(SIGTERM);
        EXPECT_EQ(session_->wait(std::chrono::seconds(60)), 0) << file_text(out_);
        session_.reset();
        const auto stopping = events(out_, "stopping");
        return stopping.empty() ? Json() : parse(stopping.back());
    }
    // The paced client inside production's namespace, through --listen.
    Json paced(double rate, long count, const std::vector<std::string>& command, int port = 0) {
        std::vector<std::string> argv = {"nsenter", "--net=" + prod_ns_->path(), build_dir() + "/tests/launcher_paced_client",
                                         "127.0.0.1:" + std::to_string(port ? port : listen_port_),
                                         std::to_string(rate), std::to_string(count)};
        argv.insert(argv.end(), command.begin(), command.end());
        const auto r = run(argv, {}, std::chrono::seconds(600));
        EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
        return parse(r.out);
    }
    // `iprobe investigate RECORD ARGS --json`: its output, and its report and
    // replay result events.
    struct Investigation {
        CommandResult run;
        Json report, replay;
    };
    Investigation investigate(const std::string& record, const std::vector<std::string>& args) {
        std::vector<std::string> argv = {bin("iprobe"), "investigate", record};
        argv.insert(argv.end(), args.begin(), args.end());
        argv.push_back("--json");
        Investigation i{run(argv, {}, std::chrono::seconds(120)), {}, {}};
        std::istringstream lines(i.run.out);
        for (std::string line; std::getline(lines, line);) {
            const Json e = parse(line);
            if (e.value("event", "") == "report") i.report = e;
            if (e.value("event", "") == "replay") i.replay = e["result"];
        }
        return i;
    }
    std::string via_mirror(const std::vector<std::string>& args) { return redis_cli(prod_ns_->path(), listen_port_, args); }
    // Sends `commands` (RESP) on one connection through --listen and reads
    // `replies` bytes of answers.
    std::string one_connection(const std::string& commands, std::size_t reply_bytes) {
        const int fd = connect_in_netns(prod_ns_->path(), listen_port_);
        EXPECT_GE(fd, 0);
        if (fd < 0) return {};
        EXPECT_EQ(::write(fd, commands.data(), commands.size()), static_cast<ssize_t>(commands.size()));
        std::string replies;
        char buf[4096];
        while (replies.size() < reply_bytes) {
            pollfd p{fd, POLLIN, 0};
            if (::poll(&p, 1, 10000) != 1) break;
            const ssize_t n = ::read(fd, buf, sizeof buf);
            if (n <= 0) break;
            replies.append(buf, static_cast<std::size_t>(n));
        }
        ::close(fd);
        return replies;
    }

    TempDir dir_;
    TempDir records_;  // outside the service's working directory (dir_), which checkpoints copy
    std::string server_, out_;
    std::unique_ptr<Netns> prod_ns_;
    int port_ = 0, listen_port_ = 0;
    std::unique_ptr<Redis> redis_;
    std::unique_ptr<Child> session_;
};

// The last PID handed out in the PID namespace of `pid`, as read by a
// process started there (which takes it): two reads with nothing started in
// between differ by one.
long last_pid_in_namespace_of(long long pid) {
    const auto r = run({"nsenter", "--target", std::to_string(pid), "--pid", "--", "cat", "/proc/sys/kernel/ns_last_pid"});
    return r.exit_code == 0 ? std::stol(r.out) : -1;
}

// The calls per function of a "report" event or of `iprobe report --json`.
std::map<std::string, std::uint64_t> calls_of(const Json& report) {
    std::map<std::string, std::uint64_t> out;
    for (const auto& f : report.value("functions", Json::array())) out[f.value("name", "")] = f.value("calls", 0ull);
    return out;
}

std::string resp(const std::vector<std::string>& args) {
    std::string out = "*" + std::to_string(args.size()) + "\r\n";
    for (const auto& a : args) out += "$" + std::to_string(a.size()) + "\r\n" + a + "\r\n";
    return out;
}

// The same load twice, at half of production's measured capacity: a
// command that calls thousands of probed functions (SORT of 600 strings)
// makes the fully probed clone several times slower than production on any
// CPU, so with every probe on the clone falls behind by more than its
// buffer; with --adapt the costliest probes go and it stays inside.  The
// load is a number of commands, not a time, so a slower machine runs
// longer, not differently.
TEST_F(DebugWindow, AdaptKeepsTheCloneWithinItsBufferWhereTheFixedProbeSetOverflows) {
    for (int batch = 0; batch < 6; ++batch) {
        std::vector<std::string> push = {"RPUSH", "biglist"};
        for (int i = 0; i < 100; ++i) push.push_back("element-" + std::to_string(batch * 100 + i));
        ASSERT_NE(redis_->cli(push), "");
    }
    ASSERT_EQ(redis_->cli({"LLEN", "biglist"}), "600");
    const std::vector<std::string> sort = {"SORT", "biglist", "ALPHA", "LIMIT", "0", "1"};
    const Json capacity = paced(1e9, 20000, sort, port_);
    const double half = capacity.value("rate", 0.0) / 2;
    ASSERT_GT(half, 100) << capacity;
    constexpr long kCommands = 50000;
    const std::vector<std::string> probe_everything = {"--functions", "*", "--no-trace", "--buffer", "1M"};

    // Every probe on, all the time: the debug window closes.
    start_session("fixed.out", probe_everything);
    const Json fixed_load = paced(half, kCommands, sort);
    EXPECT_EQ(fixed_load.value("replies", 0L), kCommands) << fixed_load;
    const Json fixed = stop_session();
    EXPECT_GE(fixed["stats"]["buffer"].value("overflows", 0), 1) << fixed_load << "\n" << file_text(out_);
    EXPECT_TRUE(events(out_, "adapt").empty());

    // The same with --adapt: no overflow, because probes went ...
    start_session("adapt.out", [&] {
        auto args = probe_everything;
        args.push_back("--adapt");
        return args;
    }());
    // Every change goes to the clone's probe agent as a message: no process
    // starts in the clone's PID namespace from here on.
    const long long adapting_clone = json_number(events(out_, "clone").back(), "clone_pid");
    const long pid_before = last_pid_in_namespace_of(adapting_clone);
    ASSERT_GT(pid_before, 0);
    const Json adapt_load = paced(half, kCommands, sort);
    EXPECT_EQ(adapt_load.value("replies", 0L), kCommands) << adapt_load;
    // ... and came back once the load was over.
    const auto restored = [&] {
        const auto changes = events(out_, "adapt");
        return !changes.empty() && parse(changes.back()).value("action", "") == "restore" &&
               parse(changes.back()).value("probed", 0) == parse(changes.back()).value("of", -1);
    };
    for (int i = 0; i < 1200 && !restored() && session_->running(); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const auto changes = events(out_, "adapt");
    std::string log;
    for (const auto& c : changes) log += c.substr(0, 300) + "\n";
    ASSERT_TRUE(restored()) << log;
    EXPECT_EQ(last_pid_in_namespace_of(adapting_clone), pid_before + 1)
        << changes.size() << " adapt changes started processes in the clone";
    const Json first = parse(changes.front());
    EXPECT_EQ(first.value("action", ""), "drop") << log;
    EXPECT_FALSE(first["functions"].empty());
    EXPECT_FALSE(first.value("reason", "").empty());
    // `iprobe report` of the clone marks what was not probed all the time.
    const long long clone_pid = json_number(events(out_, "clone").back(), "clone_pid");
    const auto region = run({bin("iprobe"), "report", std::to_string(clone_pid), "--json"});
    ASSERT_EQ(region.exit_code, 0) << region.err;
    const std::string dropped = first["functions"][0].get<std::string>();
    const Json region_report = parse(region.out);
    Json row;
    for (const auto& f : region_report["functions"])
        if (f.value("name", "") == dropped) row = f;
    EXPECT_GT(row.value("live_ns", 0ull), 0u) << dropped << " was on before it was dropped: " << row << "\n" << log;
    EXPECT_GT(row.value("live_since_ns", 0ull), row.value("window_start_ns", 0ull) + row.value("live_ns", 0ull))
        << dropped << " was off for a while: " << row << "\n" << log;
    const Json adapted = stop_session();
    EXPECT_EQ(adapted["stats"]["buffer"].value("overflows", -1), 0) << adapt_load << "\n" << file_text(out_).substr(0, 4000);
    // The session's report says for which part of the window each function
    // was probed: the dropped one in two stretches at least, with a gap.
    const auto reports = events(out_, "report");
    ASSERT_EQ(reports.size(), 1u);
    const Json report = parse(reports.front());
    Json stretches;
    for (const auto& f : report["functions"])
        if (f.value("name", "") == dropped) stretches = f["probed"];
    ASSERT_GE(stretches.size(), 2u) << dropped << ": " << stretches << "\n" << log;
    EXPECT_LT(stretches[0][1].get<double>(), stretches[1][0].get<double>()) << stretches;
    EXPECT_DOUBLE_EQ(stretches.back()[1].get<double>(), report.value("end_s", 0.0)) << stretches;
    EXPECT_EQ(redis_->cli({"PING"}), "PONG");
}

// Retro-logging: the session recorded a checkpoint and the input after it,
// with no probes at all; investigate turns on probes nobody had then and
// counts exactly the calls that input caused, and says the replay answered
// as production did.
TEST_F(DebugWindow, InvestigateReproducesTheExactCallsOfTheRecordedTrafficWithNewProbes) {
    ASSERT_EQ(redis_->cli({"SET", "before", "checkpoint"}), "OK");
    const std::string record = records_ / "record";
    start_session("record.out", {"--record", record});
    std::string commands;
    for (int i = 0; i < 5; ++i) commands += resp({"SET", "k" + std::to_string(i), "v" + std::to_string(i)});
    for (int i = 0; i < 2; ++i) commands += resp({"INCR", "counter"});
    for (int i = 0; i < 3; ++i) commands += resp({"GET", "k" + std::to_string(i)});
    const std::string expected = "+OK\r\n+OK\r\n+OK\r\n+OK\r\n+OK\r\n:1\r\n:2\r\n$2\r\nv0\r\n$2\r\nv1\r\n$2\r\nv2\r\n";
    EXPECT_EQ(one_connection(commands, expected.size()), expected);
    stop_session();
    ASSERT_TRUE(fs::exists(record + "/gen-000001/checkpoint/checkpoint.json"));
    ASSERT_TRUE(fs::exists(record + "/gen-000001/input.rec"));
    const Json generation = Json::parse(file_text(record + "/gen-000001/generation.json"), nullptr, false);
    EXPECT_EQ(generation.value("complete", false), true) << file_text(record + "/gen-000001/generation.json");
    // Production moved on since; the recording did not.
    ASSERT_EQ(redis_->cli({"SET", "k0", "changed-later"}), "OK");

    const auto [r, report, replay] =
        investigate(record, {"--functions", "setCommand,getCommand,incrCommand,processCommand"});
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    const auto calls = calls_of(report);
    EXPECT_EQ(calls.at("setCommand"), 5u) << r.out;
    EXPECT_EQ(calls.at("incrCommand"), 2u) << r.out;
    EXPECT_EQ(calls.at("getCommand"), 3u) << r.out;
    EXPECT_EQ(calls.at("processCommand"), 10u) << r.out;
    EXPECT_EQ(replay["comparison"].value("compared", 0), 10) << r.out;
    EXPECT_EQ(replay["comparison"].value("mismatches", -1), 0) << r.out;
    const std::string clone_ns = json_string(r.out, "netns");
    EXPECT_FALSE(clone_ns.empty());
    EXPECT_FALSE(fs::exists(clone_ns)) << "the investigation's clone outlived it";
    EXPECT_EQ(redis_->cli({"GET", "k0"}), "changed-later");
}

// Two clients INCRementing one key through the session (issue 26): the
// live clone's differences are only another interleaving (reordered, no
// divergence), and investigate replays the recording in production's order
// across the connections: every INCR answered as production did, exit 0.
// A clone whose counter was tampered with is still caught.
TEST_F(DebugWindow, ConcurrentWritersOfOneKeyAreNoDivergenceLiveOrInvestigated) {
    const std::string record = records_ / "record";
    start_session("incr.out", {"--record", record});
    const auto bench = run({"nsenter", "--net=" + prod_ns_->path(), "/usr/bin/redis-benchmark", "-p",
                            std::to_string(listen_port_), "-c", "2", "-n", "3000", "-t", "incr", "-q"},
                           {}, std::chrono::seconds(120));
    ASSERT_EQ(bench.exit_code, 0) << bench.err;
    ASSERT_EQ(redis_->cli({"GET", "counter:__rand_int__"}), "3000");
    const Json stopping = stop_session();
    const Json& divergence = stopping["stats"]["divergence"];
    EXPECT_EQ(divergence.value("mismatches", -1), 0) << stopping;
    EXPECT_EQ(divergence.value("diverged_connections", -1), 0) << stopping;

    const auto [r, report, replay] = investigate(record, {"--functions", "incrCommand"});
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_EQ(calls_of(report).at("incrCommand"), 3000u) << r.out;
    EXPECT_TRUE(replay.value("ordered", false)) << r.out;
    EXPECT_GE(replay["comparison"].value("compared", 0), 3000) << r.out;
    EXPECT_EQ(replay["comparison"].value("mismatches", -1), 0) << r.out;

    // The same load with the clone's counter tampered with: caught live.
    start_session("tampered.out", {});
    const std::string clone_ns = json_string(events(out_, "clone").at(0), "netns");
    ASSERT_EQ(redis_cli(clone_ns, port_, {"SET", "counter:__rand_int__", "1000000"}), "OK");
    const auto again = run({"nsenter", "--net=" + prod_ns_->path(), "/usr/bin/redis-benchmark", "-p",
                            std::to_string(listen_port_), "-c", "2", "-n", "3000", "-t", "incr", "-q"},
                           {}, std::chrono::seconds(120));
    ASSERT_EQ(again.exit_code, 0) << again.err;
    std::this_thread::sleep_for(std::chrono::seconds(2));  // the clone answers, the differences are judged
    const Json tampered = stop_session();
    EXPECT_EQ(tampered["stats"]["divergence"].value("mismatches", -1), 3000) << tampered;
    EXPECT_EQ(tampered["stats"]["divergence"].value("diverged_connections", -1), 2) << tampered;
}

// A replay that cannot be faithful says so: a write made to production
// behind the mirror's back is in no recording, so a reply that depended on
// it differs, and the request is named.
TEST_F(DebugWindow, InvestigateSaysWhereTheReplayDivergedFromProduction) {
    const std::string record = records_ / "record";
    start_session("record.out", {"--record", record});
    EXPECT_EQ(via_mirror({"SET", "shared", "through-the-mirror"}), "OK");
    ASSERT_EQ(redis_->cli({"SET", "shared", "behind-its-back"}), "OK");
    EXPECT_EQ(via_mirror({"GET", "shared"}), "behind-its-back");
    stop_session();
    const auto r = run({bin("iprobe"), "investigate", record, "--functions", "getCommand"}, {}, std::chrono::seconds(120));
    EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
    EXPECT_NE(r.err.find("1 differ on 1 connection(s)"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("to 'GET shared': production \"$15\\r\\nbehind-its-back\\r\\n\""), std::string::npos) << r.err;
    EXPECT_NE(r.out.find("getCommand"), std::string::npos) << r.out;
}

// The ring of generations is bounded: with a bound smaller than one
// generation, each new one replaces the last and stops recording its input.
TEST_F(DebugWindow, RecordKeepsARingOfGenerationsWithinMaxSize) {
    const std::string record = records_ / "record";
    start_session("ring.out", {"--record", record, "--max-size", "64K", "--recloning", "periodic:2"});
    ASSERT_TRUE(wait_for_event(out_, "clone", 3, *session_, std::chrono::seconds(120))) << file_text(out_);
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    stop_session();
    std::vector<std::string> generations;
    for (const auto& e : fs::directory_iterator(record)) generations.push_back(e.path().filename().string());
    ASSERT_EQ(generations.size(), 1u) << file_text(out_);
    EXPECT_GE(std::stoi(generations.front().substr(4)), 3) << generations.front();
    EXPECT_GE(events(out_, "record").size(), 3u);
    bool stopped = false;
    for (const auto& e : events(out_, "record")) stopped |= e.find("\"stopped\":\"max-size\"") != std::string::npos;
    EXPECT_TRUE(stopped) << file_text(out_);
}

// Scaled mode: two clones of one checkpoint, each fed the whole stream, the
// probed functions split between them; the reports merge their counts.
TEST_F(DebugWindow, TwoClonesSplitTheProbesAndTheReportsMergeThem) {
    start_session("clones.out", {"--clones", "2", "--functions", "setCommand,getCommand,processCommand"});
    const auto attached = events(out_, "attached");
    ASSERT_EQ(attached.size(), 2u) << file_text(out_);
    std::set<std::string> all;
    std::map<std::string, int> clone_of;
    for (const auto& line : attached) {
        const Json a = parse(line);
        for (const auto& f : a["functions"]) {
            EXPECT_TRUE(all.insert(f.get<std::string>()).second) << f << " probed in two clones";
            clone_of[f.get<std::string>()] = a.value("clone", -1);
        }
    }
    EXPECT_EQ(all, (std::set<std::string>{"setCommand", "getCommand", "processCommand"}));
    std::vector<std::string> clone_ns;
    std::string pids;
    for (const auto& line : events(out_, "clone")) {
        clone_ns.push_back(json_string(line, "netns"));
        pids += (pids.empty() ? "" : ",") + std::to_string(json_number(line, "clone_pid"));
    }
    ASSERT_EQ(clone_ns.size(), 2u);

    std::string commands;
    for (int i = 0; i < 4; ++i) commands += resp({"SET", "s" + std::to_string(i), "x"});
    for (int i = 0; i < 3; ++i) commands += resp({"GET", "s" + std::to_string(i)});
    const std::string expected = "+OK\r\n+OK\r\n+OK\r\n+OK\r\n$1\r\nx\r\n$1\r\nx\r\n$1\r\nx\r\n";
    EXPECT_EQ(one_connection(commands, expected.size()), expected);
    // `iprobe report` of both clones merges the functions each probed.
    const auto merged = run({bin("iprobe"), "report", pids, "--json"});
    ASSERT_EQ(merged.exit_code, 0) << merged.err;
    const auto region_calls = calls_of(parse(merged.out));
    EXPECT_EQ(region_calls.at("setCommand"), 4u) << merged.out;
    EXPECT_EQ(region_calls.at("getCommand"), 3u) << merged.out;
    EXPECT_EQ(region_calls.at("processCommand"), 7u) << merged.out;
    EXPECT_EQ(region_calls.size(), 3u) << merged.out;
    const Json stopping = stop_session();
    // Both clones got the whole stream and answered every command as
    // production did (asking them directly would count too).
    const Json& stats = stopping["stats"];
    ASSERT_EQ(stats["debug_targets"].size(), 2u) << stopping;
    for (const auto& target : stats["debug_targets"]) EXPECT_EQ(target.value("bytes", 0ull), commands.size()) << target;
    EXPECT_EQ(stats["divergence"].value("compared", 0), 14) << stats;
    EXPECT_EQ(stats["divergence"].value("mismatches", -1), 0) << stats;
    const auto reports = events(out_, "report");
    ASSERT_EQ(reports.size(), 1u) << file_text(out_);
    const Json report = parse(reports.front());
    EXPECT_EQ(calls_of(report), region_calls) << reports.front();
    for (const auto& f : report["functions"])
        EXPECT_EQ(f.value("clone", -1), clone_of.at(f.value("name", ""))) << f;
    for (const auto& ns : clone_ns) EXPECT_FALSE(fs::exists(ns)) << ns;
}

TEST_F(DebugWindow, OptionsThatNeedEachOtherAreUsageErrors) {
    const std::string pid = std::to_string(redis_->pid());
    const std::vector<std::string> base = {bin("iprobe"), "debug", pid, "--listen", "127.0.0.1:1", "--production",
                                           "127.0.0.1:" + std::to_string(port_)};
    auto with = [&](std::vector<std::string> extra) {
        auto argv = base;
        argv.insert(argv.end(), extra.begin(), extra.end());
        return run(argv).exit_code;
    };
    EXPECT_EQ(with({"--adapt"}), 2);                          // nothing to turn off and on
    EXPECT_EQ(with({"--max-size", "1G"}), 2);                 // bounds --record
    EXPECT_EQ(with({"--clones", "0"}), 2);
    EXPECT_EQ(with({"--record", records_ / "r", "--max-size", "lots"}), 2);
    EXPECT_EQ(with({"--record", dir_.path()}), 2);            // inside the service's working directory
    EXPECT_EQ(run({bin("iprobe"), "investigate"}).exit_code, 2);
    EXPECT_EQ(run({bin("iprobe"), "investigate", dir_ / "nothing-recorded-here"}).exit_code, 5);
}

}  // namespace
