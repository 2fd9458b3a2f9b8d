// iprobe attach to a real redis-server built with iprobe-cc while
// redis-benchmark runs against it: no client errors, the trace shows the
// command handlers, detach, the benchmark carries on to a clean finish.
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <memory>
#include <thread>

#include "hotpatch_fixture.h"

namespace iprobe::test {
namespace {

// A redis-server built in the finstrument flow, started in its own folder;
// `dir` holds its redis-cli and redis-benchmark.
class HotpatchRedis : public ::testing::Test {
protected:
    void SetUp() override {
        if (!is_root()) GTEST_SKIP() << "needs root";
        const std::string server = build_redis("finstrument");
        ASSERT_FALSE(server.empty()) << "scripts/build-redis --mode finstrument failed";
        dir = server.substr(0, server.rfind('/'));
        server_ = std::make_unique<RedisServer>(server, tmp);
        ASSERT_TRUE(server_->ready());
    }
    std::string dir;
    TempDir tmp;
    std::unique_ptr<RedisServer> server_;
};

TEST_F(HotpatchRedis, AttachTraceDetachWhileBenchmarkRuns) {
    RedisServer& redis = *server_;
    const int port = redis.port();
    const std::string pid = std::to_string(redis.pid());
    const auto text_before = text_of(redis.pid(), "/redis-server");

    Child bench({dir + "/redis-benchmark", "-p", std::to_string(port), "-t", "set,get", "-n", "300000", "-c", "8",
                 "-r", "1000", "-q"},
                tmp / "bench.out");
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    ASSERT_TRUE(bench.running());

    auto a = iprobe({"attach", pid, "--functions", "*Command", "--ring-records", "262144"});
    ASSERT_EQ(a.exit_code, 0) << a.err;
    EXPECT_NE(a.out.find("runtime injected"), std::string::npos) << a.out;
    auto t = iprobe({"trace", pid, "--duration", "1.5"});
    ASSERT_EQ(t.exit_code, 0) << t.err;
    const bool saw_set = t.out.find("-> setCommand") != std::string::npos;
    const bool saw_get = t.out.find("-> getCommand") != std::string::npos;
    EXPECT_TRUE(saw_set || saw_get) << t.out.substr(0, 2000);
    auto r = iprobe({"report", pid, "--json"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    ASSERT_TRUE(bench.running()) << "benchmark ended before detach: make it longer";
    auto d = iprobe({"detach", pid});
    ASSERT_EQ(d.exit_code, 0) << d.err;
    EXPECT_EQ(text_of(redis.pid(), "/redis-server"), text_before);

    EXPECT_EQ(bench.wait(std::chrono::minutes(5)), 0);
    const std::string out = file_text(tmp / "bench.out");
    EXPECT_NE(out.find("SET:"), std::string::npos) << out;
    EXPECT_NE(out.find("GET:"), std::string::npos) << out;
    EXPECT_EQ(out.find("rror"), std::string::npos) << out;
    auto ping = run({dir + "/redis-cli", "-p", std::to_string(port), "ping"});
    EXPECT_EQ(ping.out, "PONG\n");
}

// Redis's sdslen (static inline in sds.h) is inlined hundreds of times;
// in the -finstrument-functions flow each copy's hooks stay in its caller.
// Its `s` (a char*) is read where each copy keeps it: a --when on the key
// records exactly the calls on it, each entry with its exit; the copies
// where gcc left `s` nowhere readable are counted, said, and record none.
TEST_F(HotpatchRedis, WhenOnAnInlinedHelpersArgumentInEveryCopy) {
    RedisServer& redis = *server_;
    const std::string port = std::to_string(redis.port());
    const std::string pid = std::to_string(redis.pid());
    auto a = iprobe({"attach", pid, "--functions", "sdslen", "--args", "--when", "s == \"user:42\"", "--json"});
    ASSERT_EQ(a.exit_code, 0) << a.out << a.err;
    EXPECT_GT(json_number(a.out, "selected"), 200) << a.out;  // hundreds of copies
    const long long undecidable = json_number(a.out, "when_undecidable");
    EXPECT_GT(undecidable, 0) << a.out;
    EXPECT_LT(undecidable, json_number(a.out, "selected") / 10) << a.out;
    EXPECT_EQ(run({dir + "/redis-cli", "-p", port, "set", "user:42", "hello"}).out, "OK\n");
    EXPECT_EQ(run({dir + "/redis-cli", "-p", port, "get", "user:42"}).out, "hello\n");
    EXPECT_EQ(run({dir + "/redis-cli", "-p", port, "set", "user:7", "x"}).out, "OK\n");
    auto t = iprobe({"trace", pid, "--duration", "0", "--format", "json"});
    ASSERT_EQ(t.exit_code, 0) << t.err;
    std::size_t entries = 0, exits = 0, on_key = 0;
    for (std::size_t at = 0; (at = t.out.find("\"kind\":\"", at)) != std::string::npos; at++) {
        const std::size_t end = t.out.find('\n', at);
        const std::string line = t.out.substr(at, end - at);
        if (line.rfind("\"kind\":\"entry\"", 0) == 0) {
            entries++;
            on_key += line.find("{\"name\":\"s\",\"type\":\"const char*\",\"value\":\"user:42\"}") != std::string::npos;
        } else if (line.rfind("\"kind\":\"exit\"", 0) == 0) {
            exits++;
        }
    }
    EXPECT_GT(entries, 0u) << t.out;
    EXPECT_EQ(on_key, entries) << t.out;  // exactly the calls on the key
    EXPECT_EQ(exits, entries) << t.out;
    // matched, summed over sdslen's out-of-line copies (one per file), is what the trace holds
    auto r = iprobe({"report", pid, "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    long long matched = 0;
    for (std::size_t at = 0; (at = r.out.find("\"matched\":", at)) != std::string::npos; at++)
        matched += std::stoll(r.out.substr(at + 10));
    EXPECT_EQ(matched, static_cast<long long>(entries)) << r.out;
    auto d = iprobe({"detach", pid});
    EXPECT_EQ(d.exit_code, 0) << d.err;
}

}  // namespace
}  // namespace iprobe::test
