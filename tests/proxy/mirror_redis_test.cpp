// `iprobe mirror` / `iprobe replay` end to end with real redis-server,
// redis-cli and redis-benchmark on loopback ports.
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "testutil.h"

using namespace iprobe::test;
using namespace std::chrono_literals;

namespace {

std::string mirror_tool() { return build_dir() + "/libexec/iprobe/iprobe-mirror"; }
std::string iprobe_cli() { return bin("iprobe"); }

bool have_redis() { return ::access("/usr/bin/redis-server", X_OK) == 0 && ::access("/usr/bin/redis-cli", X_OK) == 0; }

class Redis {
public:
    Redis() : port_(free_port()) {
        child_ = Child({"/usr/bin/redis-server", "--port", std::to_string(port_), "--bind", "127.0.0.1", "::1",
                        "--save", "", "--appendonly", "no", "--enable-debug-command", "yes", "--daemonize", "no"},
                       "/dev/null");
        if (!wait_for_port(port_, 10s)) throw std::runtime_error("redis-server did not start");
    }
    int port() const { return port_; }
    pid_t pid() const { return child_.pid(); }
    std::string addr() const { return "127.0.0.1:" + std::to_string(port_); }
    std::string cli(const std::vector<std::string>& args) const {
        std::vector<std::string> argv = {"/usr/bin/redis-cli", "-p", std::to_string(port_)};
        argv.insert(argv.end(), args.begin(), args.end());
        auto r = run(argv);
        while (!r.out.empty() && r.out.back() == '\n') r.out.pop_back();
        return r.out;
    }
    std::string digest() const { return cli({"DEBUG", "DIGEST"}); }
    void signal(int sig) { child_.kill(sig); }

private:
    int port_;
    Child child_;
};

// Stats JSON lookup without a JSON library: the number after "key": inside
// the object named `section` (or anywhere when section is empty).
std::optional<double> json_number(const std::string& json, const std::string& section, const std::string& key) {
    std::size_t from = 0;
    if (!section.empty()) {
        from = json.find("\"" + section + "\":");
        if (from == std::string::npos) return std::nullopt;
    }
    const auto at = json.find("\"" + key + "\":", from);
    if (at == std::string::npos) return std::nullopt;
    return std::stod(json.substr(at + key.size() + 3));
}

// A TCP connection to 127.0.0.1:port; -1 when refused.
int connect_loopback(int port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) return fd;
    if (fd >= 0) ::close(fd);
    return -1;
}

std::string http_get(int port) {
    const int fd = connect_loopback(port);
    std::string out;
    if (fd >= 0) {
        const std::string req = "GET /stats HTTP/1.1\r\nHost: x\r\n\r\n";
        ::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
        char buf[65536];
        pollfd p{fd, POLLIN, 0};
        while (::poll(&p, 1, 5000) > 0) {
            const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
            if (n <= 0) break;
            out.append(buf, static_cast<std::size_t>(n));
        }
        ::close(fd);
    }
    const auto body = out.find("\r\n\r\n");
    return body == std::string::npos ? std::string() : out.substr(body + 4);
}

std::string fd_listing(pid_t pid) {
    return sh("ls -l /proc/" + std::to_string(pid) + "/fd").out;
}

int count_fds(pid_t pid) {
    int n = 0;
    if (DIR* d = ::opendir(("/proc/" + std::to_string(pid) + "/fd").c_str())) {
        while (const dirent* e = ::readdir(d))
            if (e->d_name[0] != '.') ++n;
        ::closedir(d);
    }
    return n;
}

class Mirror {
public:
    explicit Mirror(std::vector<std::string> args, const std::string& log_dir) : log_(log_dir + "/mirror.log") {
        std::vector<std::string> argv = {mirror_tool(), "mirror", "--listen", "127.0.0.1:0", "--stats", "127.0.0.1:0", "--json"};
        argv.insert(argv.end(), args.begin(), args.end());
        child_ = Child(argv, log_);
        const auto deadline = std::chrono::steady_clock::now() + 10s;
        static const std::regex listen_re("\"listen\":\"[^\"]*:([0-9]+)\"");
        static const std::regex stats_re("\"stats\":\"[^\"]*:([0-9]+)\"");
        while (std::chrono::steady_clock::now() < deadline) {
            const std::string text = file_text(log_);
            std::smatch m1, m2;
            if (std::regex_search(text, m1, listen_re) && std::regex_search(text, m2, stats_re)) {
                port_ = std::stoi(m1[1]);
                stats_port_ = std::stoi(m2[1]);
                return;
            }
            if (!child_.running()) break;
            std::this_thread::sleep_for(20ms);
        }
        throw std::runtime_error("iprobe mirror did not report listening: " + file_text(log_));
    }
    int port() const { return port_; }
    pid_t pid() const { return child_.pid(); }
    std::string stats() const { return http_get(stats_port_); }
    double stat(const std::string& section, const std::string& key) const {
        const auto v = json_number(stats(), section, key);
        return v ? *v : -1;
    }
    std::string log() const { return file_text(log_); }
    int stop() {
        child_.kill(SIGTERM);
        return child_.wait(10s);
    }
    // Polls until the stats satisfy `ok` (the debug side finishes after clients do).
    template <typename Pred>
    bool wait_stats(Pred ok, std::chrono::milliseconds timeout = 15s) const {
        const auto deadline = std::chrono::steady_clock::now() + timeout;
        while (std::chrono::steady_clock::now() < deadline) {
            if (ok(stats())) return true;
            std::this_thread::sleep_for(50ms);
        }
        return false;
    }

private:
    std::string log_;
    Child child_;
    int port_ = 0;
    int stats_port_ = 0;
};

bool idle(const std::string& s) {
    return json_number(s, "connections", "active") == 0.0 && json_number(s, "connections", "lingering_debug") == 0.0;
}

// A deterministic RESP workload for one connection: SETs, INCRs, RPUSHes
// and GETs on keys of its own, so any interleaving of connections gives the
// same dataset.
std::string workload(int conn, int commands, int value_size = 16) {
    std::string out;
    const auto cmd = [&](std::initializer_list<std::string> args) {
        out += "*" + std::to_string(args.size()) + "\r\n";
        for (const auto& a : args) out += "$" + std::to_string(a.size()) + "\r\n" + a + "\r\n";
    };
    for (int i = 0; i < commands; ++i) {
        const std::string key = "c" + std::to_string(conn) + ":k" + std::to_string(i % 5000);
        std::string value = std::to_string(i * 7919 % 100003);
        value.resize(static_cast<std::size_t>(value_size), 'v');
        switch (i % 4) {
        case 0: cmd({"SET", key, value}); break;
        case 1: cmd({"INCR", "c" + std::to_string(conn) + ":counter"}); break;
        case 2: cmd({"RPUSH", "c" + std::to_string(conn) + ":list", value}); break;
        default: cmd({"GET", key}); break;
        }
    }
    return out;
}

// Runs `connections` redis-cli --pipe clients in parallel against `port`;
// each must report 0 errors and every reply.
void pipe_workload(const TempDir& dir, int port, int connections, int commands, int value_size = 16,
                   const std::string& host = "127.0.0.1") {
    std::string script;
    for (int c = 0; c < connections; ++c) {
        const std::string file = dir / ("w" + std::to_string(c) + ".resp");
        std::ofstream(file, std::ios::binary) << workload(c, commands, value_size);
        script += "/usr/bin/redis-cli -h " + host + " -p " + std::to_string(port) + " --pipe < " + file + " > " + file +
                  ".out 2>&1 &\n";
    }
    script += "wait\n";
    const auto r = sh(script, 180s);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    for (int c = 0; c < connections; ++c) {
        const std::string out = file_text(dir / ("w" + std::to_string(c) + ".resp.out"));
        EXPECT_NE(out.find("errors: 0, replies: " + std::to_string(commands)), std::string::npos)
            << "connection " << c << ": " << out;
    }
}

#define REQUIRE_REDIS() \
    if (!have_redis()) GTEST_SKIP() << "redis-server/redis-cli not installed (scripts/setup installs them)"

}  // namespace

TEST(Mirror, EveryByteReachesProductionAndTheDebugCopyKeepsUp) {
    REQUIRE_REDIS();
    TempDir dir;
    Redis direct, production, debug;
    constexpr int kConns = 6, kCommands = 20000;
    pipe_workload(dir, direct.port(), kConns, kCommands);

    Mirror m({"--production", production.addr(), "--debug", debug.addr(), "--divergence", "resp"}, dir.path());
    pipe_workload(dir, m.port(), kConns, kCommands);
    ASSERT_TRUE(m.wait_stats(idle)) << m.stats();

    EXPECT_EQ(production.digest(), direct.digest());
    EXPECT_EQ(debug.digest(), direct.digest());
    EXPECT_EQ(production.cli({"DBSIZE"}), direct.cli({"DBSIZE"}));
    const std::string s = m.stats();
    // redis-cli --pipe ends each stream with one "ECHO <20 random bytes>" (43 bytes) to find the last reply.
    std::size_t sent = 0;
    for (int c = 0; c < kConns; ++c) sent += workload(c, kCommands).size() + 43;
    EXPECT_EQ(json_number(s, "bytes", "client_to_production"), static_cast<double>(sent)) << s;
    EXPECT_EQ(json_number(s, "bytes", "to_debug"), static_cast<double>(sent)) << s;
    EXPECT_EQ(json_number(s, "bytes", "from_debug"), json_number(s, "bytes", "production_to_client")) << s;
    EXPECT_EQ(json_number(s, "divergence", "compared"), static_cast<double>(kConns * (kCommands + 1))) << s;
    EXPECT_EQ(json_number(s, "divergence", "mismatches"), 0.0) << s;
    EXPECT_EQ(json_number(s, "buffer", "overflows"), 0.0) << s;
    EXPECT_EQ(json_number(s, "debug", "completed"), static_cast<double>(kConns)) << s;
    EXPECT_EQ(m.stop(), 0) << m.log();
}

TEST(Mirror, RedisBenchmarkThroughTheMirrorKeepsBothCopiesEqual) {
    REQUIRE_REDIS();
    TempDir dir;
    Redis production, debug;
    Mirror m({"--production", production.addr(), "--debug", debug.addr(), "--divergence", "resp"}, dir.path());
    // Many connections, commands whose replies do not depend on how the
    // connections interleave (every SET answers +OK) ...
    auto r = run({"/usr/bin/redis-benchmark", "-p", std::to_string(m.port()), "-t", "set,ping", "-n", "40000", "-c",
                  "20", "-r", "5000", "-P", "4", "-q", "--csv"}, {}, 120s);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("\"SET\""), std::string::npos) << r.out;
    // ... and order-dependent commands from one connection at a time.
    r = run({"/usr/bin/redis-benchmark", "-p", std::to_string(m.port()), "-t", "incr,lpush,rpop,get", "-n", "5000",
             "-c", "1", "-r", "100", "-q", "--csv"}, {}, 120s);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    ASSERT_TRUE(m.wait_stats(idle)) << m.stats();
    EXPECT_EQ(debug.digest(), production.digest());
    EXPECT_NE(production.cli({"DBSIZE"}), "0");
    const std::string s = m.stats();
    EXPECT_EQ(json_number(s, "divergence", "mismatches"), 0.0) << s;
    EXPECT_GE(json_number(s, "divergence", "compared").value_or(0), 100000.0) << s;
    EXPECT_EQ(json_number(s, "buffer", "overflows"), 0.0) << s;
    EXPECT_EQ(json_number(s, "debug", "completed"), json_number(s, "connections", "accepted")) << s;
}

TEST(Mirror, StoppedDebugCopyOverflowsWithoutTouchingProduction) {
    REQUIRE_REDIS();
    TempDir dir;
    Redis direct, production, debug;
    constexpr int kConns = 4, kCommands = 40000, kValue = 100;  // ~4.6 MB per connection
    pipe_workload(dir, direct.port(), kConns, kCommands, kValue);

    Mirror m({"--production", production.addr(), "--debug", debug.addr(), "--buffer", "256K", "--divergence", "resp"},
             dir.path());
    debug.signal(SIGSTOP);
    pipe_workload(dir, m.port(), kConns, kCommands, kValue);
    EXPECT_EQ(production.digest(), direct.digest());
    ASSERT_TRUE(m.wait_stats(idle)) << m.stats();
    std::string s = m.stats();
    EXPECT_EQ(json_number(s, "buffer", "overflows"), static_cast<double>(kConns)) << s;
    EXPECT_EQ(json_number(s, "debug_windows_ms", "count"), static_cast<double>(kConns)) << s;
    EXPECT_GT(json_number(s, "debug_windows_ms", "max").value_or(0), 0.0) << s;
    EXPECT_LE(json_number(s, "buffer", "high_water_connection").value_or(1e12), 256.0 * 1024) << s;
    EXPECT_GT(json_number(s, "buffer", "high_water_connection").value_or(0), 128.0 * 1024) << s;
    EXPECT_EQ(json_number(s, "divergence", "mismatches"), 0.0) << s;  // a stopped copy is behind, not different

    // Resumed, the debug copy gets new connections mirrored again.
    debug.signal(SIGCONT);
    const auto r = run({"/usr/bin/redis-cli", "-p", std::to_string(m.port()), "SET", "after:resume", "yes"});
    EXPECT_EQ(r.out, "OK\n");
    ASSERT_TRUE(m.wait_stats([](const std::string& st) {
        return idle(st) && json_number(st, "debug", "completed").value_or(0) >= 1;
    })) << m.stats();
    EXPECT_EQ(debug.cli({"GET", "after:resume"}), "yes");
    s = m.stats();
    EXPECT_EQ(json_number(s, "buffer", "overflows"), static_cast<double>(kConns)) << s;
    EXPECT_NE(m.log().find("debug buffer full"), std::string::npos) << m.log();
}

TEST(Mirror, KilledDebugCopyLeavesProductionUnaffected) {
    REQUIRE_REDIS();
    TempDir dir;
    Redis direct, production;
    auto debug = std::make_unique<Redis>();
    constexpr int kConns = 4, kCommands = 60000;
    pipe_workload(dir, direct.port(), kConns, kCommands);

    Mirror m({"--production", production.addr(), "--debug", debug->addr(), "--buffer", "64M"}, dir.path());
    std::thread killer([&] {
        // kill as soon as the debug copy has seen some traffic
        for (int i = 0; i < 400; ++i) {
            if (json_number(m.stats(), "bytes", "to_debug").value_or(0) > 100000) break;
            std::this_thread::sleep_for(5ms);
        }
        debug->signal(SIGKILL);
    });
    pipe_workload(dir, m.port(), kConns, kCommands);
    killer.join();
    EXPECT_EQ(production.digest(), direct.digest());
    ASSERT_TRUE(m.wait_stats(idle)) << m.stats();
    const std::string s = m.stats();
    EXPECT_EQ(json_number(s, "connections", "production_errors"), 0.0) << s;
    // Later connections find no debug copy; production still serves them.
    const auto r = run({"/usr/bin/redis-cli", "-p", std::to_string(m.port()), "GET", "c0:k0"});
    EXPECT_EQ(r.out, direct.cli({"GET", "c0:k0"}) + "\n");
    ASSERT_TRUE(m.wait_stats([](const std::string& st) {
        return idle(st) && json_number(st, "debug", "connect_failures").value_or(0) >= 1;
    })) << m.stats();
    EXPECT_EQ(m.stop(), 0);
}

TEST(Mirror, DivergentDebugCopyIsReportedWithTheFirstMismatchingCommand) {
    REQUIRE_REDIS();
    TempDir dir;
    Redis production, debug;
    for (int i = 0; i < 100; ++i) {
        production.cli({"SET", "user:" + std::to_string(i), "name" + std::to_string(i)});
        debug.cli({"SET", "user:" + std::to_string(i), i == 42 ? "mallory" : "name" + std::to_string(i)});
    }
    Mirror m({"--production", production.addr(), "--debug", debug.addr(), "--divergence", "resp"}, dir.path());
    std::string commands;
    for (int i = 0; i < 100; ++i) commands += "GET user:" + std::to_string(i) + "\r\n";
    commands += "SET user:42 fixed\r\nGET user:42\r\n";
    std::ofstream(dir / "cmds") << commands;
    const auto r = sh("/usr/bin/redis-cli -p " + std::to_string(m.port()) + " --pipe < " + dir / "cmds");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("errors: 0, replies: 102"), std::string::npos) << r.out;
    // the client sees production's values
    EXPECT_EQ(run({"/usr/bin/redis-cli", "-p", std::to_string(m.port()), "GET", "user:41"}).out, "name41\n");
    ASSERT_TRUE(m.wait_stats(idle)) << m.stats();
    const std::string s = m.stats();
    EXPECT_EQ(json_number(s, "divergence", "mismatches"), 1.0) << s;
    EXPECT_EQ(json_number(s, "divergence", "diverged_connections"), 1.0) << s;
    EXPECT_EQ(json_number(s, "reports", "reply_index"), 42.0) << s;
    EXPECT_NE(s.find("\"request\":\"GET user:42\""), std::string::npos) << s;
    EXPECT_NE(s.find("mallory"), std::string::npos) << s;
    EXPECT_NE(m.log().find("'GET user:42'"), std::string::npos) << m.log();
    EXPECT_EQ(json_number(s, "divergence", "compared"), 103.0 + 1) << s;  // + redis-cli's ECHO, + the GET user:41
}

// Byte for byte (`--divergence stream`, for protocols the mirror does not
// frame): `compared` counts the bytes found equal, every one of a copy that
// kept up, and those before the first difference of one that did not, whose
// offset the report gives.
TEST(Mirror, StreamDivergenceCountsTheBytesFoundEqualUpToTheFirstDifference) {
    REQUIRE_REDIS();
    TempDir dir;
    std::string commands;
    for (int i = 0; i < 100; ++i) commands += "GET user:" + std::to_string(i) + "\r\n";
    std::ofstream(dir / "cmds") << commands;
    for (const bool tampered : {false, true}) {
        Redis production, debug;
        for (int i = 0; i < 100; ++i) {
            production.cli({"SET", "user:" + std::to_string(i), "name" + std::to_string(i)});
            debug.cli({"SET", "user:" + std::to_string(i), tampered && i == 42 ? "mallory" : "name" + std::to_string(i)});
        }
        TempDir logs;  // a mirror's own: the next one's port is read from its log
        Mirror m({"--production", production.addr(), "--debug", debug.addr(), "--divergence", "stream"}, logs.path());
        const auto r = sh("/usr/bin/redis-cli -p " + std::to_string(m.port()) + " --pipe < " + dir / "cmds");
        ASSERT_EQ(r.exit_code, 0) << r.err;
        ASSERT_TRUE(m.wait_stats(idle)) << m.stats();
        const std::string s = m.stats();
        if (!tampered) {
            // 100 replies and redis-cli's closing ECHO, every byte equal
            EXPECT_EQ(json_number(s, "divergence", "compared"), json_number(s, "bytes", "production_to_client")) << s;
            EXPECT_GT(json_number(s, "divergence", "compared").value_or(0), 1000.0) << s;
            EXPECT_EQ(json_number(s, "divergence", "mismatches"), 0.0) << s;
            continue;
        }
        // "$5\r\nname0\r\n" (11 bytes) x 10, "$6\r\nname10\r\n" (12) x 32, then "$" of
        // "$6\r\nname42" against "$7\r\nmallory": the first difference at 495
        EXPECT_EQ(json_number(s, "divergence", "mismatches"), 1.0) << s;
        EXPECT_EQ(json_number(s, "divergence", "diverged_connections"), 1.0) << s;
        EXPECT_EQ(json_number(s, "reports", "byte_offset"), 495.0) << s;
        EXPECT_EQ(json_number(s, "divergence", "compared"), 495.0) << s;
    }
}

// Two clients INCRementing one key: the copy is fed each connection on its
// own and deals the counter's values out in another interleaving.  Live,
// such differences are `reordered`, not divergence; a recording replays in
// production's order across connections, with no difference at all.  A copy
// whose counter was tampered with is still caught, live and in replay.
TEST(Mirror, ConcurrentWritersOfOneKeyAreReorderedNotDiverged) {
    REQUIRE_REDIS();
    TempDir dir;
    Redis production, debug, fresh, tampered;
    const std::string rec = dir / "incr.rec";
    const auto incr_load = [&](int port) {
        const auto r = run({"/usr/bin/redis-benchmark", "-p", std::to_string(port), "-c", "2", "-n", "3000", "-t",
                            "incr", "-q"},
                           {}, 60s);
        ASSERT_EQ(r.exit_code, 0) << r.err;
    };
    {
        Mirror m({"--production", production.addr(), "--debug", debug.addr(), "--divergence", "resp", "--record", rec},
                 dir.path());
        incr_load(m.port());
        ASSERT_TRUE(m.wait_stats(idle)) << m.stats();
        const std::string s = m.stats();
        EXPECT_EQ(json_number(s, "divergence", "mismatches"), 0.0) << s;
        EXPECT_EQ(json_number(s, "divergence", "diverged_connections"), 0.0) << s;
        EXPECT_EQ(json_number(s, "divergence", "unclassified"), 0.0) << s;
        EXPECT_EQ(debug.cli({"GET", "counter:__rand_int__"}), "3000");
        EXPECT_EQ(m.stop(), 0) << m.log();
    }
    EXPECT_EQ(production.cli({"GET", "counter:__rand_int__"}), "3000");
    const auto r = run({iprobe_cli(), "replay", rec, "--to", fresh.addr(), "--speed", "0", "--compare", "resp", "--json"});
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("\"ordered\":true,\"order_timeouts\":0"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("\"mismatches\":0,\"diverged_connections\":0"), std::string::npos) << r.out;
    EXPECT_EQ(json_number(r.out, "comparison", "compared").value_or(0), 3000.0) << r.out;

    // Tampered: the copy's counter starts far from production's.
    ASSERT_EQ(tampered.cli({"SET", "counter:__rand_int__", "1000000"}), "OK");
    const auto t = run({iprobe_cli(), "replay", rec, "--to", tampered.addr(), "--speed", "0", "--compare", "resp"});
    EXPECT_EQ(t.exit_code, 1) << t.out << t.err;
    EXPECT_NE(t.out.find(" 3000 differ on 2 connection(s)"), std::string::npos) << t.out;
    ASSERT_EQ(tampered.cli({"SET", "counter:__rand_int__", "1000000"}), "OK");
    TempDir live;
    Mirror m({"--production", production.addr(), "--debug", tampered.addr(), "--divergence", "resp"}, live.path());
    incr_load(m.port());
    ASSERT_TRUE(m.wait_stats(idle)) << m.stats();
    const std::string s = m.stats();
    EXPECT_EQ(json_number(s, "divergence", "mismatches"), 3000.0) << s;
    EXPECT_EQ(json_number(s, "divergence", "reordered"), 0.0) << s;
    EXPECT_EQ(json_number(s, "divergence", "diverged_connections"), 2.0) << s;
}

TEST(Mirror, RuleFileExcludesNoisyCommands) {
    REQUIRE_REDIS();
    TempDir dir;
    Redis production, debug;
    production.cli({"SET", "session", "prod-1234"});
    debug.cli({"SET", "session", "clone-5678"});
    std::ofstream(dir / "rules") << "# session tokens differ between copies\nresp.ignore-command get\n";
    Mirror m({"--production", production.addr(), "--debug", debug.addr(), "--divergence", "resp",
              "--divergence-rules", dir / "rules"}, dir.path());
    std::string commands;
    for (int i = 0; i < 50; ++i) commands += "GET session\r\nTIME\r\nPING\r\n";  // TIME: a default rule
    std::ofstream(dir / "cmds") << commands;
    ASSERT_EQ(sh("/usr/bin/redis-cli -p " + std::to_string(m.port()) + " --pipe < " + dir / "cmds").exit_code, 0);
    ASSERT_TRUE(m.wait_stats(idle)) << m.stats();
    const std::string s = m.stats();
    EXPECT_EQ(json_number(s, "divergence", "ignored"), 100.0) << s;
    EXPECT_EQ(json_number(s, "divergence", "compared"), 51.0) << s;  // PINGs + the closing ECHO
    EXPECT_EQ(json_number(s, "divergence", "mismatches"), 0.0) << s;
}

TEST(Mirror, RecordThenReplayReproducesProduction) {
    REQUIRE_REDIS();
    TempDir dir;
    Redis production, fresh, fresh_timed;
    const std::string rec = dir / "traffic.rec";
    {
        Mirror m({"--production", production.addr(), "--record", rec}, dir.path());
        pipe_workload(dir, m.port(), 5, 10000);
        const auto r = run({"/usr/bin/redis-benchmark", "-p", std::to_string(m.port()), "-t", "set,lpush", "-n", "5000",
                            "-c", "10", "-r", "1000", "-q"}, {}, 60s);
        ASSERT_EQ(r.exit_code, 0);
        ASSERT_TRUE(m.wait_stats(idle));
        EXPECT_EQ(m.stop(), 0) << m.log();  // the recording is complete once the mirror exits
    }
    const auto r = run({iprobe_cli(), "replay", rec, "--to", fresh.addr(), "--speed", "0", "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("\"connect_failures\":0"), std::string::npos) << r.out;
    EXPECT_EQ(fresh.digest(), production.digest());
    // Timed replay (recorded pace, doubled) gives the same dataset.
    const auto t = run({iprobe_cli(), "replay", rec, "--to", fresh_timed.addr(), "--speed", "2"});
    ASSERT_EQ(t.exit_code, 0) << t.out << t.err;
    EXPECT_EQ(fresh_timed.digest(), production.digest());

    std::ofstream(dir / "junk") << "not a recording";
    const auto bad = run({iprobe_cli(), "replay", dir / "junk", "--to", fresh.addr()});
    EXPECT_EQ(bad.exit_code, 3) << bad.err;
    EXPECT_NE(bad.err.find("not an iprobe recording"), std::string::npos) << bad.err;
}

// The recording keeps production's replies: a replay into a copy in the
// same state answers the same, one into a copy whose state differs is
// caught, the request named.
TEST(Mirror, ReplayComparesTheRepliesWithTheRecordedOnes) {
    REQUIRE_REDIS();
    TempDir dir;
    Redis production, same, different;
    const std::string rec = dir / "traffic.rec";
    {
        Mirror m({"--production", production.addr(), "--record", rec}, dir.path());
        pipe_workload(dir, m.port(), 3, 2000);
        ASSERT_TRUE(m.wait_stats(idle));
        EXPECT_EQ(m.stop(), 0) << m.log();
    }
    const auto r = run({iprobe_cli(), "replay", rec, "--to", same.addr(), "--speed", "0", "--compare", "resp", "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    // Every reply: 2000 commands and redis-cli --pipe's closing ECHO, on each of 3 connections.
    EXPECT_NE(r.out.find("\"compared\":6003,\"ignored\":0,\"mismatches\":0,\"diverged_connections\":0"),
              std::string::npos)
        << r.out;
    // A counter that starts elsewhere: every INCR of connection 1 answers differently.
    ASSERT_EQ(different.cli({"SET", "c1:counter", "1000"}), "OK");
    const auto d = run({iprobe_cli(), "replay", rec, "--to", different.addr(), "--speed", "0", "--compare", "resp"});
    EXPECT_EQ(d.exit_code, 1) << d.out << d.err;
    EXPECT_NE(d.out.find(" 500 differ on 1 connection(s)"), std::string::npos) << d.out;
    EXPECT_NE(d.out.find("reply 1 to 'INCR c1:counter': production \":1\\r\\n\", replay \":1001\\r\\n\""),
              std::string::npos)
        << d.out;
    // Byte for byte, for protocols iprobe cannot frame.
    const auto old = run({iprobe_cli(), "replay", rec, "--to", same.addr(), "--speed", "0", "--compare", "stream", "--json"});
    EXPECT_NE(old.out.find("\"mode\":\"stream\""), std::string::npos) << old.out;
}

// Several debug copies: each gets the whole stream through a buffer of its
// own, so a stopped one overflows alone and the other keeps up.
TEST(Mirror, EachDebugCopyGetsTheWholeStreamThroughItsOwnBuffer) {
    REQUIRE_REDIS();
    TempDir dir;
    Redis direct, production, first, second;
    constexpr int kConns = 4, kCommands = 5000;
    pipe_workload(dir, direct.port(), kConns, kCommands);
    Mirror m({"--production", production.addr(), "--debug", first.addr(), "--debug", second.addr(), "--divergence",
              "resp", "--buffer", "1M"},
             dir.path());
    pipe_workload(dir, m.port(), kConns, kCommands);
    ASSERT_TRUE(m.wait_stats(idle)) << m.stats();
    EXPECT_EQ(first.digest(), direct.digest());
    EXPECT_EQ(second.digest(), direct.digest());
    std::string s = m.stats();
    std::size_t sent = 0;
    for (int c = 0; c < kConns; ++c) sent += workload(c, kCommands).size() + 43;
    EXPECT_EQ(json_number(s, "bytes", "to_debug"), static_cast<double>(2 * sent)) << s;
    EXPECT_EQ(json_number(s, "divergence", "compared"), static_cast<double>(2 * kConns * (kCommands + 1))) << s;
    EXPECT_EQ(json_number(s, "divergence", "mismatches"), 0.0) << s;
    EXPECT_NE(s.find("\"debug_targets\":[{\"address\":\"" + first.addr() + "\",\"connections\":4,"), std::string::npos) << s;
    EXPECT_NE(s.find("{\"address\":\"" + second.addr() + "\",\"connections\":4,"), std::string::npos) << s;

    // One connection, one 32 KiB SET at a time, each sent once production
    // answered the one before and the running copy's buffer is empty again
    // (a loaded machine could otherwise leave it 1 MiB behind too): the
    // stopped copy takes nothing and its 1M buffer runs over.
    second.signal(SIGSTOP);
    {
        const int fd = connect_loopback(m.port());
        ASSERT_GE(fd, 0);
        const std::regex first_drained("\"address\":\"" + first.addr() + "\"[^}]*\"buffered\":0[,}]");
        for (int i = 0; i < 80; ++i) {
            const std::string key = "big" + std::to_string(i), value(32768, static_cast<char>('a' + i % 26));
            const std::string set = "*3\r\n$3\r\nSET\r\n$" + std::to_string(key.size()) + "\r\n" + key + "\r\n$" +
                                    std::to_string(value.size()) + "\r\n" + value + "\r\n";
            ASSERT_EQ(::send(fd, set.data(), set.size(), MSG_NOSIGNAL), static_cast<ssize_t>(set.size()));
            std::string reply;
            char c;
            pollfd p{fd, POLLIN, 0};
            while (reply.size() < 5 && ::poll(&p, 1, 30000) == 1 && ::recv(fd, &c, 1, 0) == 1) reply += c;
            ASSERT_EQ(reply, "+OK\r\n") << "SET " << key;
            ASSERT_TRUE(m.wait_stats([&](const std::string& st) { return std::regex_search(st, first_drained); }))
                << m.stats();
        }
        ::close(fd);
    }
    ASSERT_TRUE(m.wait_stats([](const std::string& st) {
        return json_number(st, "connections", "active") == 0.0 && json_number(st, "buffer", "overflows") == 1.0;
    })) << m.stats();
    s = m.stats();
    // The stopped copy's connection overflowed; the running one completed.
    EXPECT_NE(s.find("{\"address\":\"" + second.addr() + "\",\"connections\":5,\"connect_failures\":0,\"overflows\":1"),
              std::string::npos)
        << s;
    EXPECT_NE(s.find("{\"address\":\"" + first.addr() + "\",\"connections\":5,\"connect_failures\":0,\"overflows\":0"),
              std::string::npos)
        << s;
    second.signal(SIGCONT);
    EXPECT_EQ(m.stop(), 0) << m.log();
    EXPECT_EQ(first.digest(), production.digest());
}

TEST(Mirror, NoLeakedDescriptorsAfterManyConnections) {
    REQUIRE_REDIS();
    TempDir dir;
    Redis production, debug;
    const int unused = free_port();
    Mirror m({"--production", production.addr(), "--debug", debug.addr()}, dir.path());
    ASSERT_TRUE(m.wait_stats(idle));
    const int before = count_fds(m.pid());
    const std::string listing = fd_listing(m.pid());
    // -k 0: a new connection per request: 2000 connections, 50 at a time.
    auto r = run({"/usr/bin/redis-benchmark", "-p", std::to_string(m.port()), "-t", "set", "-n", "2000", "-c", "50",
                  "-k", "0", "-q"}, {}, 120s);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    ASSERT_TRUE(m.wait_stats(idle)) << m.stats();
    EXPECT_GE(m.stat("connections", "accepted"), 2000.0);
    EXPECT_EQ(count_fds(m.pid()), before) << listing << "\nafter:\n" << fd_listing(m.pid());

    // Same with an unreachable debug copy and with stopped one that overflows.
    TempDir dir2;
    Mirror m2({"--production", production.addr(), "--debug", "127.0.0.1:" + std::to_string(unused)}, dir2.path());
    ASSERT_TRUE(m2.wait_stats(idle));
    const int before2 = count_fds(m2.pid());
    const std::string listing2 = fd_listing(m2.pid());
    r = run({"/usr/bin/redis-benchmark", "-p", std::to_string(m2.port()), "-t", "set", "-n", "500", "-c", "20", "-k", "0", "-q"}, {}, 60s);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    ASSERT_TRUE(m2.wait_stats(idle)) << m2.stats();
    EXPECT_GE(m2.stat("debug", "connect_failures"), 500.0);
    EXPECT_EQ(count_fds(m2.pid()), before2) << listing2 << "\nafter:\n" << fd_listing(m2.pid());
    EXPECT_EQ(m2.stop(), 0);
}

TEST(Mirror, UnreachableProductionClosesTheClient) {
    REQUIRE_REDIS();
    TempDir dir;
    const int nothing = free_port();
    Mirror m({"--production", "127.0.0.1:" + std::to_string(nothing)}, dir.path());
    const auto r = run({"/usr/bin/redis-cli", "-p", std::to_string(m.port()), "PING"}, {}, 10s);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_EQ(r.out.find("PONG"), std::string::npos);
    ASSERT_TRUE(m.wait_stats(idle));
    EXPECT_EQ(m.stat("connections", "production_connect_failures"), 1.0);
    EXPECT_NE(m.log().find("cannot connect to production"), std::string::npos) << m.log();
}

TEST(Mirror, Ipv6ListenAndProduction) {
    REQUIRE_REDIS();
    TempDir dir;
    Redis production, debug;
    const int port = free_port();
    Child c({mirror_tool(), "mirror", "--listen", "[::1]:" + std::to_string(port), "--production",
             "[::1]:" + std::to_string(production.port()), "--debug", debug.addr()}, dir / "log");
    for (int i = 0; i < 200 && file_text(dir / "log").find("listening on") == std::string::npos; ++i)
        std::this_thread::sleep_for(20ms);
    ASSERT_NE(file_text(dir / "log").find("listening on [::1]:" + std::to_string(port)), std::string::npos)
        << file_text(dir / "log");
    const auto r = run({"/usr/bin/redis-cli", "-h", "::1", "-p", std::to_string(port), "SET", "v6", "yes"});
    EXPECT_EQ(r.out, "OK\n") << r.err;
    EXPECT_EQ(production.cli({"GET", "v6"}), "yes");
    for (int i = 0; i < 100 && debug.cli({"GET", "v6"}) != "yes"; ++i) std::this_thread::sleep_for(20ms);
    EXPECT_EQ(debug.cli({"GET", "v6"}), "yes");
    c.kill(SIGTERM);
    EXPECT_EQ(c.wait(10s), 0);
}

TEST(Mirror, SignalsDumpStatsAndStopCleanly) {
    REQUIRE_REDIS();
    TempDir dir;
    Redis production;
    Mirror m({"--production", production.addr()}, dir.path());
    ASSERT_EQ(run({"/usr/bin/redis-cli", "-p", std::to_string(m.port()), "SET", "a", "1"}).out, "OK\n");
    ::kill(m.pid(), SIGUSR1);
    for (int i = 0; i < 100 && m.log().find("\"accepted\":1") == std::string::npos; ++i) std::this_thread::sleep_for(20ms);
    EXPECT_NE(m.log().find("\"accepted\":1"), std::string::npos) << m.log();
    EXPECT_EQ(m.stop(), 0);
    EXPECT_NE(m.log().find("{\"event\":\"stopped\""), std::string::npos) << m.log();
}

// Whoever runs the mirror may hold its stderr pipe without reading it: the
// proxy drops log lines rather than stall (and stall production with it).
TEST(Mirror, UnreadStderrNeverStallsProduction) {
    REQUIRE_REDIS();
    TempDir dir;
    Redis production;
    const std::string fifo = dir / "stderr.fifo";
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);  // held open, never read
    ASSERT_GE(reader, 0);
    const int port = free_port();
    Child m({mirror_tool(), "mirror", "--listen", "127.0.0.1:" + std::to_string(port), "--production",
             production.addr()}, fifo);
    ASSERT_TRUE(wait_for_port(port));
    // ~1 KiB of JSON per SIGUSR1 (spaced: pending signals coalesce); the 64 KiB pipe fills.
    for (int i = 0; i < 1000; ++i) {
        ::kill(m.pid(), SIGUSR1);
        std::this_thread::sleep_for(2ms);
    }
    const auto r = run({"/usr/bin/redis-cli", "-p", std::to_string(port), "PING"}, {}, 10s);
    EXPECT_EQ(r.out, "PONG\n") << r.err;
    m.kill(SIGTERM);
    char buf[65536];
    while (::read(reader, buf, sizeof buf) > 0) {}  // let the final stats out
    EXPECT_EQ(m.wait(10s), 0);
    ::close(reader);
}

TEST(Mirror, CommandLineErrors) {
    TempDir dir;
    const auto code = [](std::vector<std::string> args) {
        args.insert(args.begin(), {iprobe_cli(), "mirror"});
        return run(args, {}, 10s);
    };
    auto r = code({"--listen", "127.0.0.1", "--production", "127.0.0.1:1"});
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find("--listen '127.0.0.1': no port"), std::string::npos) << r.err;
    r = code({"--listen", "127.0.0.1:0"});
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find("--production is required"), std::string::npos) << r.err;
    r = code({"--listen", "127.0.0.1:0", "--production", "127.0.0.1:1", "--buffer", "lots"});
    EXPECT_EQ(r.exit_code, 2);
    r = code({"--listen", "127.0.0.1:0", "--production", "127.0.0.1:1", "--divergence", "xml"});
    EXPECT_EQ(r.exit_code, 2);
    r = code({"--listen", "127.0.0.1:0", "--production", "127.0.0.1:1", "--frobnicate", "1"});
    EXPECT_EQ(r.exit_code, 2);
    std::ofstream(dir / "rules") << "resp.ignore-command TIME\nnonsense here\n";
    r = code({"--listen", "127.0.0.1:0", "--production", "127.0.0.1:1", "--debug", "127.0.0.1:2", "--divergence",
              "resp", "--divergence-rules", dir / "rules"});
    EXPECT_EQ(r.exit_code, 3);
    EXPECT_NE(r.err.find(":2: unknown rule 'nonsense'"), std::string::npos) << r.err;

    // A port in use: exit 6 with a message naming the address.
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::listen(fd, 1);
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    const std::string busy = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
    r = code({"--listen", busy, "--production", "127.0.0.1:1"});
    ::close(fd);
    EXPECT_EQ(r.exit_code, 6);
    EXPECT_NE(r.err.find(busy + ": address already in use"), std::string::npos) << r.err;

    r = run({iprobe_cli(), "mirror", "--help"});
    EXPECT_EQ(r.exit_code, 0);
    EXPECT_NE(r.out.find("--divergence-rules"), std::string::npos);
    r = run({iprobe_cli(), "replay"});
    EXPECT_EQ(r.exit_code, 2);
}

TEST(Mirror, HttpDivergenceNamesTheRequestAndHonoursHeaderRules) {
    if (::access("/usr/bin/python3", X_OK) != 0 || ::access("/usr/bin/curl", X_OK) != 0)
        GTEST_SKIP() << "needs /usr/bin/python3 (http.server) and /usr/bin/curl";
    TempDir dir;
    sh("mkdir -p " + dir / "prod" + " " + dir / "debug");
    std::ofstream(dir / "prod/a.txt") << "same everywhere\n";
    std::ofstream(dir / "prod/b.txt") << "production's b\n";
    std::ofstream(dir / "debug/b.txt") << "the copy's b!\n";
    sh("sleep 1.1; echo 'same everywhere' > " + dir / "debug/a.txt");  // a later Last-Modified
    const int prod_port = free_port(), debug_port = free_port();
    Child prod({"/usr/bin/python3", "-m", "http.server", std::to_string(prod_port), "--bind", "127.0.0.1",
                "--directory", dir / "prod"});
    Child debug({"/usr/bin/python3", "-m", "http.server", std::to_string(debug_port), "--bind", "127.0.0.1",
                 "--directory", dir / "debug"});
    ASSERT_TRUE(wait_for_port(prod_port) && wait_for_port(debug_port));
    std::ofstream(dir / "rules") << "http.ignore-header Last-Modified\n";
    Mirror m({"--production", "127.0.0.1:" + std::to_string(prod_port), "--debug",
              "127.0.0.1:" + std::to_string(debug_port), "--divergence", "http", "--divergence-rules", dir / "rules"},
             dir.path());
    const std::string base = "http://127.0.0.1:" + std::to_string(m.port());
    for (const char* path : {"/a.txt", "/a.txt", "/b.txt", "/a.txt"}) {
        const auto r = run({"/usr/bin/curl", "-s", base + path});
        EXPECT_NE(r.out.find(std::string(path) == "/b.txt" ? "production's b" : "same everywhere"), std::string::npos);
    }
    ASSERT_TRUE(m.wait_stats(idle)) << m.stats();
    const std::string s = m.stats();
    EXPECT_EQ(json_number(s, "divergence", "compared"), 4.0) << s;
    EXPECT_EQ(json_number(s, "divergence", "mismatches"), 1.0) << s;
    EXPECT_NE(s.find("\"request\":\"GET /b.txt HTTP/1.1\""), std::string::npos) << s;
}

TEST(MirrorAggregator, DebugCopyGetsProductionsRepliesAndNeverReachesTheBackend) {
    REQUIRE_REDIS();
    TempDir dir;
    Redis backend;
    Mirror m({"--upstream", backend.addr(), "--debug-listen", "127.0.0.1:0", "--divergence", "stream"}, dir.path());
    const std::regex dl("\"debug_listen\":\"[^\"]*:([0-9]+)\"");
    std::smatch match;
    const std::string log = m.log();
    ASSERT_TRUE(std::regex_search(log, match, dl)) << log;
    const std::string debug_port = match[1];

    const std::string session = "INCR counter\nINCR counter\nSET k v\nGET k\nINCR counter\n";
    const auto prod = run({"/usr/bin/redis-cli", "-p", std::to_string(m.port())}, session);
    ASSERT_EQ(prod.exit_code, 0) << prod.err;
    EXPECT_EQ(prod.out, "1\n2\nOK\nv\n3\n");
    // The debug copy sends the same requests and gets the same answers, while
    // the backend's counter stays at 3.
    const auto dbg = run({"/usr/bin/redis-cli", "-p", debug_port}, session);
    ASSERT_EQ(dbg.exit_code, 0) << dbg.err;
    EXPECT_EQ(dbg.out, prod.out);
    EXPECT_EQ(backend.cli({"GET", "counter"}), "3");

    // A second pair where the debug copy asks something else: reported.
    ASSERT_EQ(run({"/usr/bin/redis-cli", "-p", std::to_string(m.port()), "GET", "k"}).out, "v\n");
    const auto other = run({"/usr/bin/redis-cli", "-p", debug_port, "DEL", "k"});
    EXPECT_EQ(other.out, "v\n");  // it gets production's reply, the backend is untouched
    EXPECT_EQ(backend.cli({"GET", "k"}), "v");
    ASSERT_TRUE(m.wait_stats([](const std::string& s) { return json_number(s, "divergence", "mismatches") == 1.0; }))
        << m.stats();
    EXPECT_EQ(m.stop(), 0) << m.log();
}
