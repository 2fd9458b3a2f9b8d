// `iprobe debug --capture`: the clone is fed production's own traffic, taken
// off the wire; production's clients are never repointed, and a connection
// they opened before the session is mirrored from its next command.  Needs
// root (CRIU, namespaces, packet capture).
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <sstream>
#include <thread>

#include "redis_fixture.h"

namespace fs = std::filesystem;
using namespace iprobe::test;

namespace {

// One RESP command on an open connection; the reply's first line (or bulk value).
std::string command(int fd, const std::vector<std::string>& args) {
    std::string req = "*" + std::to_string(args.size()) + "\r\n";
    for (const auto& a : args) req += "$" + std::to_string(a.size()) + "\r\n" + a + "\r\n";
    if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) return "(send failed)";
    std::string reply;
    char buf[4096];
    pollfd p{fd, POLLIN, 0};
    while (reply.find("\r\n") == std::string::npos ||
           (reply[0] == '$' && reply.find("\r\n", reply.find("\r\n") + 2) == std::string::npos)) {
        if (::poll(&p, 1, 10000) != 1) return "(no reply)";
        const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        if (n <= 0) return "(closed)";
        reply.append(buf, static_cast<std::size_t>(n));
    }
    const auto first = reply.find("\r\n");
    return reply[0] == '$' ? reply.substr(first + 2, reply.find("\r\n", first + 2) - first - 2) : reply.substr(1, first - 1);
}

// A client writing unique keys (wN:0, wN:1, ...) as fast as production
// answers, on one connection or (reconnecting) a new one every 20 writes.
class Writer {
public:
    Writer(const std::string& netns, int port, int id, bool reconnect)
        : netns_(netns), port_(port), id_(id), reconnect_(reconnect), fd_(connect_in_netns(netns, port)) {
        thread_ = std::thread([this] { loop(); });
    }
    ~Writer() { stop(); }
    void stop() {
        stop_ = true;
        if (thread_.joinable()) thread_.join();
        if (fd_ >= 0) ::close(fd_);
        fd_ = -1;
    }
    std::uint64_t written() const { return written_; }
    const std::string& error() const { return error_; }

private:
    void loop() {
        while (!stop_) {
            if (reconnect_ && written_ % 20 == 0 && written_ > 0) {
                ::close(fd_);
                fd_ = connect_in_netns(netns_, port_);
            }
            const std::string key = "w" + std::to_string(id_) + ":" + std::to_string(written_.load());
            const std::string got = fd_ < 0 ? "(no connection)" : command(fd_, {"SET", key, "v"});
            if (got != "OK") {
                error_ = key + ": " + got;
                return;
            }
            ++written_;
        }
    }
    std::string netns_;
    int port_, id_;
    bool reconnect_;
    int fd_;
    std::atomic<bool> stop_{false};
    std::atomic<std::uint64_t> written_{0};
    std::string error_;
    std::thread thread_;
};

std::vector<std::string> sorted_keys(const std::string& netns, int port) {
    std::istringstream in(redis_cli(netns, port, {"KEYS", "*"}));
    std::vector<std::string> keys;
    for (std::string line; std::getline(in, line);)
        if (!line.empty()) keys.push_back(line);
    std::sort(keys.begin(), keys.end());
    return keys;
}

}  // namespace

// Four clients write continuously across the session's start (two on
// connections open before it, two reconnecting all along): the capture
// starts before the checkpoint and the clone is fed, per connection, from
// the first request the checkpoint did not hold, so it ends with exactly
// production's keys.
// At full speed on an idle machine this covers the capture's start (packets
// around libpcap's filter swap: CaptureStart) and connections their client
// closes around the checkpoint (the FIN is no byte production read).
TEST(LauncherDebugCapture, WritesAcrossTheCheckpointAllReachTheClone) {
    IPROBE_SKIP_UNLESS_CLONING_WORKS();
    TempDir dir;
    Netns prod("ipt-dcap3-" + std::to_string(getpid()));
    const int port = free_port();
    Redis redis(prod.path(), port, dir.path());
    ASSERT_TRUE(redis.ready());
    std::vector<std::unique_ptr<Writer>> writers;
    for (int i = 0; i < 4; ++i) writers.push_back(std::make_unique<Writer>(prod.path(), port, i, i >= 2));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));

    const std::string out = dir / "debug.out";
    Child debug({"nsenter", "--net=" + prod.path(), bin("iprobe"), "debug", std::to_string(redis.pid()), "--capture",
                 "--production", "127.0.0.1:" + std::to_string(port), "--json"},
                out);
    ASSERT_TRUE(wait_for_event(out, "capture-start", 1, debug)) << file_text(out);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    for (auto& w : writers) w->stop();
    std::uint64_t written = 0;
    for (auto& w : writers) {
        EXPECT_EQ(w->error(), "");
        written += w->written();
    }
    const auto start = events(out, "capture-start").at(0);
    EXPECT_NE(start.find("\"missed\":[]"), std::string::npos) << start;
    EXPECT_NE(start.find("\"diverged\":false"), std::string::npos) << start;
    const std::string clone_netns = json_string(events(out, "clone").at(0), "netns");
    const std::vector<std::string> production = sorted_keys(prod.path(), port);
    ASSERT_EQ(production.size(), written);
    std::vector<std::string> clone;
    for (int i = 0; i < 200 && (clone = sorted_keys(clone_netns, port)).size() < production.size(); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_EQ(clone.size(), production.size());
    EXPECT_TRUE(clone == production) << "the clone lacks or has extra keys";
    for (std::size_t i = 0, shown = 0; i < production.size() && shown < 5; ++i)
        if (!std::binary_search(clone.begin(), clone.end(), production[i])) {
            ADD_FAILURE() << "missing in the clone: " << production[i];
            ++shown;
        }

    debug.kill(SIGTERM);
    EXPECT_EQ(debug.wait(std::chrono::seconds(30)), 0);
    const auto stopping = events(out, "stopping");
    ASSERT_EQ(stopping.size(), 1u) << file_text(out);
    EXPECT_NE(stopping[0].find("\"missed_connections\":0"), std::string::npos) << stopping[0];
    EXPECT_NE(stopping[0].find("\"lost_connections\":0"), std::string::npos) << stopping[0];
    EXPECT_NE(stopping[0].find("\"overflows\":0"), std::string::npos) << stopping[0];
    // (The test's own KEYS * went to production and was compared too: the
    // same keys, listed in another order by the clone's own hash table.)
    EXPECT_FALSE(fs::exists("/run/iprobe/debug-hook-" + std::to_string(debug.pid()) + ".sock"));
}

// Two clients INCRementing one key across the session's start, recorded:
// investigate restores the checkpoint and replays the recorded input (the
// held requests from the checkpoint on, in the order the capture saw them)
// and every reply equals production's, which only holds when the input
// starts exactly at the checkpoint and keeps production's order.
TEST(LauncherDebugCapture, ARecordedCaptureStartsAtTheCheckpointAndInvestigatesWithoutDifferences) {
    IPROBE_SKIP_UNLESS_CLONING_WORKS();
    TempDir dir, records;
    Netns prod("ipt-dcap4-" + std::to_string(getpid()));
    const int port = free_port();
    Redis redis(prod.path(), port, dir.path());
    ASSERT_TRUE(redis.ready());
    std::atomic<bool> stop{false};
    std::atomic<int> incrs{0};
    std::string failure;
    std::vector<std::thread> clients;
    for (int c = 0; c < 2; ++c)
        clients.emplace_back([&] {
            const int fd = connect_in_netns(prod.path(), port);
            while (!stop && fd >= 0) {
                const std::string got = command(fd, {"INCR", "shared"});
                if (got.empty() || got[0] == '(') {
                    failure = got;
                    break;
                }
                ++incrs;
            }
            if (fd >= 0) ::close(fd);
        });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const std::string out = dir / "debug.out", record = records / "record";
    Child debug({"nsenter", "--net=" + prod.path(), bin("iprobe"), "debug", std::to_string(redis.pid()), "--capture",
                 "--production", "127.0.0.1:" + std::to_string(port), "--record", record, "--json"},
                out);
    ASSERT_TRUE(wait_for_event(out, "capture-start", 1, debug)) << file_text(out);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    stop = true;
    for (auto& t : clients) t.join();
    EXPECT_EQ(failure, "");
    EXPECT_EQ(redis.cli({"GET", "shared"}), std::to_string(incrs.load()));
    const auto start = events(out, "capture-start").at(0);
    EXPECT_NE(start.find("\"missed\":[]"), std::string::npos) << start;
    std::this_thread::sleep_for(std::chrono::seconds(1));
    debug.kill(SIGTERM);
    EXPECT_EQ(debug.wait(std::chrono::seconds(30)), 0);

    const auto r = run({bin("iprobe"), "investigate", record, "--json"}, {}, std::chrono::seconds(120));
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    const auto replay = r.out.find("\"event\":\"replay\"");
    ASSERT_NE(replay, std::string::npos) << r.out << r.err;
    const std::string result = r.out.substr(replay);
    EXPECT_NE(result.find("\"mismatches\":0,\"diverged_connections\":0"), std::string::npos) << result;
    EXPECT_GT(json_number(result, "compared"), 100) << result;
    EXPECT_EQ(r.out.find("\"event\":\"warning\""), std::string::npos) << r.out;
}

TEST(LauncherDebugCapture, ProductionsOwnClientsFeedTheCloneWithoutBeingRepointed) {
    IPROBE_SKIP_UNLESS_CLONING_WORKS();
    TempDir dir;
    Netns prod("ipt-dcap-" + std::to_string(getpid()));
    const int port = free_port();
    Redis redis(prod.path(), port, dir.path());
    ASSERT_TRUE(redis.ready());
    ASSERT_EQ(redis.cli({"SET", "before", "cloned"}), "OK");
    // A client connected before the session, as a connection pool would be.
    const int pooled = connect_in_netns(prod.path(), port);
    ASSERT_GE(pooled, 0);
    ASSERT_EQ(command(pooled, {"PING"}), "PONG");

    const std::string out = dir / "debug.out";
    Child debug({"nsenter", "--net=" + prod.path(), bin("iprobe"), "debug", std::to_string(redis.pid()), "--capture",
                 "--production", "127.0.0.1:" + std::to_string(port), "--json"},
                out);
    // The capture starts first; the clone is fed once it is ready.
    ASSERT_TRUE(wait_for_event(out, "capture-start", 1, debug)) << file_text(out);
    const auto mirror = events(out, "mirror");
    ASSERT_EQ(mirror.size(), 1u) << file_text(out);
    EXPECT_EQ(json_string(mirror[0], "capture"), "lo:" + std::to_string(port)) << mirror[0];
    EXPECT_EQ(json_string(mirror[0], "divergence"), "resp") << mirror[0];
    const std::string clone_netns = json_string(events(out, "clone").at(0), "netns");
    ASSERT_FALSE(clone_netns.empty());
    EXPECT_EQ(redis_cli(clone_netns, port, {"GET", "before"}), "cloned");

    // The pooled connection and a new one, both straight to production.
    EXPECT_EQ(command(pooled, {"SET", "pooled", "yes"}), "OK");
    EXPECT_EQ(command(pooled, {"INCRBY", "n", "5"}), "5");
    EXPECT_EQ(command(pooled, {"RPUSH", "list", "a", "b"}), "2");
    EXPECT_EQ(redis.cli({"SET", "fresh", "too"}), "OK");
    ::close(pooled);
    const auto clone_has = [&](const std::vector<std::string>& args, const std::string& want) {
        std::string got;
        for (int i = 0; i < 100 && (got = redis_cli(clone_netns, port, args)) != want; ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        return got;
    };
    EXPECT_EQ(clone_has({"GET", "pooled"}, "yes"), "yes");
    EXPECT_EQ(clone_has({"GET", "n"}, "5"), "5");
    EXPECT_EQ(clone_has({"LRANGE", "list", "0", "-1"}, "a\nb"), "a\nb");
    EXPECT_EQ(clone_has({"GET", "fresh"}, "too"), "too");
    EXPECT_EQ(redis_cli(clone_netns, port, {"DBSIZE"}), redis.cli({"DBSIZE"}));

    debug.kill(SIGTERM);
    EXPECT_EQ(debug.wait(std::chrono::seconds(30)), 0);
    const auto stopping = events(out, "stopping");
    ASSERT_EQ(stopping.size(), 1u) << file_text(out);
    EXPECT_NE(stopping[0].find("\"connections_joined\":1"), std::string::npos) << stopping[0];
    EXPECT_NE(stopping[0].find("\"lost_connections\":0"), std::string::npos) << stopping[0];
    EXPECT_NE(stopping[0].find("\"mismatches\":0"), std::string::npos) << stopping[0];
    EXPECT_FALSE(netns_exists(fs::path(clone_netns).filename().string()));
    EXPECT_EQ(redis.cli({"GET", "pooled"}), "yes");
}

TEST(LauncherDebugCapture, CaptureAndListenAreExclusive) {
    auto r = run({bin("iprobe"), "debug", "1", "--capture", "--listen", "127.0.0.1:1", "--production", "127.0.0.1:2"});
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find("drop --listen"), std::string::npos) << r.err;
    r = run({bin("iprobe"), "debug", "1", "--production", "127.0.0.1:2"});
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find("--listen (or --capture)"), std::string::npos) << r.err;
}

// Two clones fed by one capture (--clones 2), the input recorded (--record):
// each clone gets every write of production's own clients, and the
// generation's recording holds them.
TEST(LauncherDebugCapture, EveryCloneGetsTheCapturedWritesAndTheInputIsRecorded) {
    IPROBE_SKIP_UNLESS_CLONING_WORKS();
    TempDir dir, records;  // the record ring outside the service's working directory
    Netns prod("ipt-dcap2-" + std::to_string(getpid()));
    const int port = free_port();
    Redis redis(prod.path(), port, dir.path());
    ASSERT_TRUE(redis.ready());
    const std::string out = dir / "debug.out", record = records / "record";
    Child debug({"nsenter", "--net=" + prod.path(), bin("iprobe"), "debug", std::to_string(redis.pid()), "--capture",
                 "--production", "127.0.0.1:" + std::to_string(port), "--clones", "2", "--record", record, "--json"},
                out);
    // The capture starts first; the clone is fed once it is ready.
    ASSERT_TRUE(wait_for_event(out, "capture-start", 1, debug)) << file_text(out);
    ASSERT_EQ(events(out, "mirror").size(), 1u) << file_text(out);
    const auto clones = events(out, "clone");
    ASSERT_EQ(clones.size(), 2u) << file_text(out);

    for (int i = 0; i < 5; ++i) ASSERT_EQ(redis.cli({"SET", "k" + std::to_string(i), "v"}), "OK");
    ASSERT_EQ(redis.cli({"INCRBY", "n", "7"}), "7");
    for (const auto& clone : clones) {
        const std::string netns = json_string(clone, "netns");
        std::string got;
        for (int i = 0; i < 100 && (got = redis_cli(netns, port, {"GET", "n"})) != "7"; ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        EXPECT_EQ(got, "7") << clone;
        EXPECT_EQ(redis_cli(netns, port, {"DBSIZE"}), "6") << clone;
    }

    debug.kill(SIGTERM);
    EXPECT_EQ(debug.wait(std::chrono::seconds(30)), 0);
    const auto stopping = events(out, "stopping");
    ASSERT_EQ(stopping.size(), 1u) << file_text(out);
    EXPECT_NE(stopping[0].find("\"lost_connections\":0"), std::string::npos) << stopping[0];
    EXPECT_NE(stopping[0].find("\"overflows\":0"), std::string::npos) << stopping[0];
    // Six connections (one per redis-cli), each recorded with its command and reply.
    ASSERT_TRUE(fs::exists(record + "/gen-000001/input.rec")) << file_text(out);
    const auto replay = run({bin("iprobe"), "replay", record + "/gen-000001/input.rec", "--to", "127.0.0.1:1",
                             "--speed", "0", "--json"});
    EXPECT_NE(replay.out.find("\"connections\":6"), std::string::npos) << replay.out << replay.err;
    for (const auto& clone : clones)
        EXPECT_FALSE(netns_exists(fs::path(json_string(clone, "netns")).filename().string()));
}
