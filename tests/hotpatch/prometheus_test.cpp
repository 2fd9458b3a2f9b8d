// `iprobe report --format prometheus` and `--serve`: a real Prometheus
// server (Debian's, installed by scripts/setup) scrapes `iprobe report
// --serve` every second, and its HTTP query API gives back a function's
// exact call count.  The server and its data directory go however the test
// ends (a Child is killed when it goes out of scope, a TempDir removed).
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "hotpatch_fixture.h"

namespace iprobe::test {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

std::string prometheus_binary() {
    for (const char* path : {"/usr/bin/prometheus", "/usr/local/bin/prometheus"})
        if (::access(path, X_OK) == 0) return path;
    return {};
}

// One instant query through Prometheus' HTTP API: the value of its one
// sample, or -1 while there is none.
long long query_value(int port, const std::string& query) {
    const auto r = run({"curl", "-s", "--max-time", "5", "-G", "--data-urlencode", "query=" + query,
                        "http://127.0.0.1:" + std::to_string(port) + "/api/v1/query"});
    if (r.exit_code != 0) return -1;
    const Json doc = Json::parse(r.out, nullptr, false);
    if (doc.is_discarded() || doc.value("status", "") != "success") return -1;
    const Json& result = doc["data"]["result"];
    if (!result.is_array() || result.size() != 1) return -1;
    return std::stoll(result[0]["value"][1].get<std::string>());
}

// Waits until `query` answers `want` (Prometheus scrapes every second).
long long eventually(int port, const std::string& query, long long want) {
    long long got = -1;
    for (int i = 0; i < 600 && got != want; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        got = query_value(port, query);
    }
    return got;
}

class PrometheusTest : public ::testing::Test {
protected:
    void SetUp() override {
        if (!is_root()) GTEST_SKIP() << "needs root (ptrace of any process, /run/iprobe)";
    }
};

TEST_F(PrometheusTest, ExpositionNamesEachFunctionWithItsExactCounts) {
    HpTarget target(2);
    const std::string pid = std::to_string(target.pid());
    const auto a = iprobe({"attach", pid, "--functions", "counted"});
    ASSERT_EQ(a.exit_code, 0) << a.err;
    ASSERT_EQ(target.command("burst 1000"), 2000);
    const auto r = iprobe({"report", pid, "--format", "prometheus"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("# TYPE iprobe_function_calls_total counter\n"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("\niprobe_function_calls_total{function=\"counted\"} 2000\n"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("\niprobe_function_completed_total{function=\"counted\"} 2000\n"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("\niprobe_function_duration_seconds_count{function=\"counted\"} 2000\n"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("\niprobe_process_info{pid=\"" + pid + "\"} 1\n"), std::string::npos) << r.out;
    // A format that has no writer for a command is a usage error, before anything is done.
    EXPECT_EQ(iprobe({"attach", pid, "--functions", "leaf", "--format", "prometheus"}).exit_code, 2);
    EXPECT_EQ(iprobe({"report", pid, "--format", "chrome"}).exit_code, 2);
    EXPECT_EQ(iprobe({"report", pid, "--serve", "nowhere"}).exit_code, 2);
}

// The count handler keeps calls alone: the exposition has no sample for
// what it did not keep (completed, times), never a 0; --completed brings the
// completed calls back, still without times.
TEST_F(PrometheusTest, AFieldTheHandlerDidNotKeepHasNoSample) {
    HpTarget target(1);
    const std::string pid = std::to_string(target.pid());
    ASSERT_EQ(iprobe({"attach", pid, "--functions", "counted", "--handler", "count"}).exit_code, 0);
    ASSERT_EQ(target.command("burst 100"), 100);
    auto r = iprobe({"report", pid, "--format", "prometheus"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("\niprobe_function_calls_total{function=\"counted\"} 100\n"), std::string::npos) << r.out;
    for (const char* absent : {"iprobe_function_completed_total{", "iprobe_function_duration_seconds{",
                               "iprobe_function_duration_seconds_count{", "iprobe_function_exclusive_seconds_total{",
                               "iprobe_function_max_seconds{"})
        EXPECT_EQ(r.out.find(absent), std::string::npos) << absent << "\n" << r.out;
    ASSERT_EQ(iprobe({"attach", pid, "--functions", "counted", "--handler", "count", "--completed"}).exit_code, 0);
    ASSERT_EQ(target.command("burst 100"), 100);
    r = iprobe({"report", pid, "--format", "prometheus"});
    EXPECT_NE(r.out.find("\niprobe_function_calls_total{function=\"counted\"} 200\n"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("\niprobe_function_completed_total{function=\"counted\"} 100\n"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("iprobe_function_duration_seconds_count{"), std::string::npos) << r.out;
}

TEST_F(PrometheusTest, ARealPrometheusScrapesReportServeAndCountsExactly) {
    const std::string prometheus = prometheus_binary();
    ASSERT_FALSE(prometheus.empty()) << "prometheus is not installed: run scripts/setup";
    HpTarget target(2);
    const std::string pid = std::to_string(target.pid());
    ASSERT_EQ(iprobe({"attach", pid, "--functions", "counted"}).exit_code, 0);
    ASSERT_EQ(target.command("burst 1234"), 2468);

    TempDir dir;
    const int metrics_port = free_port();
    Child serve({bin("iprobe"), "report", pid, "--serve", "127.0.0.1:" + std::to_string(metrics_port)},
                dir.path() + "/serve.out");
    // It answers /metrics and nothing else.
    std::string metrics;
    for (int i = 0; i < 100 && metrics.empty(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        metrics = run({"curl", "-s", "--max-time", "5", "http://127.0.0.1:" + std::to_string(metrics_port) + "/metrics"}).out;
    }
    EXPECT_NE(metrics.find("iprobe_function_calls_total{function=\"counted\"} 2468\n"), std::string::npos) << metrics;
    EXPECT_EQ(run({"curl", "-s", "-o", "/dev/null", "-w", "%{http_code}",
                   "http://127.0.0.1:" + std::to_string(metrics_port) + "/other"}).out,
              "404");

    int query_port = free_port();
    while (query_port == metrics_port) query_port = free_port();
    {
        std::ofstream config(dir.path() + "/prometheus.yml");
        config << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
               << "scrape_configs:\n  - job_name: iprobe\n    static_configs:\n      - targets: ['127.0.0.1:"
               << metrics_port << "']\n";
    }
    Child server({prometheus, "--config.file=" + dir.path() + "/prometheus.yml",
                  "--storage.tsdb.path=" + dir.path() + "/data",
                  "--web.listen-address=127.0.0.1:" + std::to_string(query_port)},
                 dir.path() + "/prometheus.out");
    const std::string calls = "iprobe_function_calls_total{function=\"counted\",job=\"iprobe\"}";
    EXPECT_EQ(eventually(query_port, calls, 2468), 2468) << file_text(dir.path() + "/prometheus.out").substr(0, 3000);
    // Counted on while scraped: the next scrapes see the new total exactly.
    ASSERT_EQ(target.command("burst 766"), 1532);
    EXPECT_EQ(eventually(query_port, calls, 4000), 4000);
    EXPECT_EQ(eventually(query_port, "iprobe_function_completed_total{function=\"counted\"}", 4000), 4000);
    server.kill(SIGTERM);
    EXPECT_EQ(server.wait(std::chrono::seconds(30)), 0);
    serve.kill(SIGINT);
    EXPECT_EQ(serve.wait(std::chrono::seconds(10)), 0) << file_text(dir.path() + "/serve.out");
}

}  // namespace
}  // namespace iprobe::test
