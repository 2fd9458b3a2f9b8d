// iprobe attach to a real redis-server built with iprobe-cc while
// redis-benchmark runs against it: no client errors, the trace shows the
// command handlers, detach, the benchmark carries on to a clean finish.
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <thread>

#include "hotpatch_fixture.h"

namespace iprobe::test {
namespace {

TEST(HotpatchRedis, AttachTraceDetachWhileBenchmarkRuns) {
    if (!is_root()) GTEST_SKIP() << "needs root";
    const std::string server = build_redis("finstrument");
    ASSERT_FALSE(server.empty()) << "scripts/build-redis --mode finstrument failed";
    const std::string dir = server.substr(0, server.rfind('/'));
    TempDir tmp;
    RedisServer redis(server, tmp);
    ASSERT_TRUE(redis.ready());
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

}  // namespace
}  // namespace iprobe::test
