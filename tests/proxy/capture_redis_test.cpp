// `iprobe mirror --capture` end to end: production is a real redis-server the
// mirror never touches; its traffic is taken off the wire and fed to a second
// redis-server (the debug copy).  Clients and production live in network
// namespaces of their own, joined by a veth pair, so the kernel really
// reorders (an HTB class that delays some segments), drops (iptables
// `statistic` before and after the capture point: retransmissions seen late,
// or twice) and duplicates (TEE) segments; loopback is tested too.
// The copy's INFO commandstats are compared with production's, command for
// command.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "iprobe/proxy/stats.h"
#include "testutil.h"

using namespace iprobe::test;
using namespace std::chrono_literals;
using iprobe::proxy::MirrorStats;

namespace {

std::string mirror_tool() { return build_dir() + "/libexec/iprobe/iprobe-mirror"; }

bool have_tools() {
    for (const char* tool : {"/usr/bin/redis-server", "/usr/bin/redis-cli", "/usr/bin/redis-benchmark", "/usr/bin/curl"})
        if (::access(tool, X_OK) != 0) return false;
    return true;
}

#define REQUIRE_TOOLS()                                                                                \
    do {                                                                                               \
        if (!is_root()) GTEST_SKIP() << "needs root (network namespaces, packet capture)";             \
        if (!have_tools()) GTEST_SKIP() << "redis-server/redis-cli/redis-benchmark/curl missing (scripts/setup)"; \
    } while (0)

void must(const std::vector<std::string>& argv) {
    const auto r = run(argv, {}, 30s);
    if (r.exit_code != 0) {
        std::string cmd;
        for (const auto& a : argv) cmd += a + " ";
        throw std::runtime_error(cmd + "failed: " + r.err);
    }
}

// A network namespace, removed with everything in it.
class Namespace {
public:
    explicit Namespace(std::string name) : name_(std::move(name)) {
        run({"ip", "netns", "delete", name_});
        must({"ip", "netns", "add", name_});
        must({"ip", "-n", name_, "link", "set", "lo", "up"});
    }
    ~Namespace() { run({"ip", "netns", "delete", name_}); }
    Namespace(const Namespace&) = delete;
    Namespace& operator=(const Namespace&) = delete;
    const std::string& name() const { return name_; }
    std::string path() const { return "/run/netns/" + name_; }
    // argv run inside the namespace.
    std::vector<std::string> in(std::vector<std::string> argv) const {
        argv.insert(argv.begin(), {"nsenter", "--net=" + path()});
        return argv;
    }

private:
    std::string name_;
};

// A socket connected from inside a namespace (a socket stays in the namespace
// it was made in, whichever thread uses it).
int connect_from(const Namespace& ns, const std::string& ip, int port) {
    int fd = -1;
    std::thread t([&] {
        const int nsfd = ::open(ns.path().c_str(), O_RDONLY | O_CLOEXEC);
        if (nsfd < 0 || ::setns(nsfd, CLONE_NEWNET) != 0) return;
        ::close(nsfd);
        const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(static_cast<std::uint16_t>(port));
        ::inet_pton(AF_INET, ip.c_str(), &a.sin_addr);
        if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) fd = s; else ::close(s);
    });
    t.join();
    return fd;
}

std::string resp_command(const std::vector<std::string>& args) {
    std::string out = "*" + std::to_string(args.size()) + "\r\n";
    for (const auto& a : args) out += "$" + std::to_string(a.size()) + "\r\n" + a + "\r\n";
    return out;
}

// One client connection speaking RESP; replies are simple lines (status,
// integer, error) or bulk strings, which is all these tests ask for.
class RespClient {
public:
    RespClient(const Namespace& ns, const std::string& ip, int port) : fd_(connect_from(ns, ip, port)) {
        if (fd_ < 0) throw std::runtime_error("cannot connect to " + ip + ":" + std::to_string(port));
    }
    ~RespClient() { close(); }
    void close() {
        if (fd_ >= 0) ::close(fd_);
        fd_ = -1;
    }
    void send(const std::string& bytes) {
        for (std::size_t sent = 0; sent < bytes.size();) {
            const ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
            if (n <= 0) throw std::runtime_error("send failed");
            sent += static_cast<std::size_t>(n);
        }
    }
    std::string reply() {
        std::string line = read_line();
        if (line.starts_with("$") && line != "$-1") {
            const std::size_t len = std::stoul(line.substr(1));
            while (buf_.size() < len + 2) fill();
            line = buf_.substr(0, len);
            buf_.erase(0, len + 2);
        }
        return line;
    }
    std::string command(const std::vector<std::string>& args) {
        send(resp_command(args));
        return reply();
    }

private:
    std::string read_line() {
        std::size_t nl;
        while ((nl = buf_.find("\r\n")) == std::string::npos) fill();
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 2);
        return line;
    }
    void fill() {
        pollfd p{fd_, POLLIN, 0};
        if (::poll(&p, 1, 30000) != 1) throw std::runtime_error("no reply within 30 s");
        char b[65536];
        const ssize_t n = ::recv(fd_, b, sizeof b, 0);
        if (n <= 0) throw std::runtime_error("connection closed");
        buf_.append(b, static_cast<std::size_t>(n));
    }
    int fd_;
    std::string buf_;
};

class RedisIn {
public:
    RedisIn(const Namespace& ns, std::vector<std::string> binds, int port) : ns_(ns), port_(port) {
        std::vector<std::string> argv = {"/usr/bin/redis-server", "--port", std::to_string(port), "--save", "",
                                         "--appendonly", "no", "--protected-mode", "no",
                                         "--enable-debug-command", "yes", "--daemonize", "no", "--bind"};
        argv.insert(argv.end(), binds.begin(), binds.end());
        child_ = Child(ns.in(argv), "/dev/null");
        for (int i = 0; i < 200; ++i) {
            if (cli({"PING"}) == "PONG") return;
            std::this_thread::sleep_for(50ms);
        }
        throw std::runtime_error("redis-server did not start in " + ns.name());
    }
    std::string cli(const std::vector<std::string>& args) const {
        std::vector<std::string> argv = {"/usr/bin/redis-cli", "-p", std::to_string(port_)};
        argv.insert(argv.end(), args.begin(), args.end());
        auto r = run(ns_.in(argv), {}, 30s);
        while (!r.out.empty() && r.out.back() == '\n') r.out.pop_back();
        return r.out;
    }
    // calls per command, from INFO commandstats ("set" -> 80000)
    std::map<std::string, long long> calls() const {
        std::map<std::string, long long> out;
        static const std::regex re("cmdstat_([a-z|]+):calls=([0-9]+)");
        const std::string text = cli({"INFO", "commandstats"});
        for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator(); ++it)
            out[(*it)[1]] = std::stoll((*it)[2]);
        return out;
    }
    std::string digest() const { return cli({"DEBUG", "DIGEST"}); }
    int port() const { return port_; }

private:
    const Namespace& ns_;
    int port_;
    Child child_;
};

// `iprobe mirror --capture` run inside `ns`; stats read through its endpoint.
class MirrorProcess {
public:
    MirrorProcess(const Namespace& ns, const TempDir& dir, std::vector<std::string> args)
        : ns_(ns), log_(dir / "mirror.log") {
        std::vector<std::string> argv = {mirror_tool(), "mirror", "--stats", "127.0.0.1:0", "--json"};
        argv.insert(argv.end(), args.begin(), args.end());
        child_ = Child(ns.in(argv), log_);
        static const std::regex ready(R"re("event":"capturing".*"stats":"127\.0\.0\.1:([0-9]+)")re");
        for (int i = 0; i < 500; ++i) {
            std::smatch m;
            const std::string text = file_text(log_);
            if (std::regex_search(text, m, ready)) {
                stats_port_ = std::stoi(m[1]);
                return;
            }
            if (!child_.running()) break;
            std::this_thread::sleep_for(20ms);
        }
        throw std::runtime_error("iprobe mirror --capture did not become ready: " + file_text(log_));
    }
    std::string stats_text() const {
        return run(ns_.in({"curl", "-s", "--max-time", "5", "http://127.0.0.1:" + std::to_string(stats_port_) + "/"}))
            .out;
    }
    MirrorStats stats() const { return iprobe::proxy::parse_mirror_stats(stats_text()); }
    // Polls until `ok` holds for the stats.
    bool wait(const std::function<bool(const MirrorStats&)>& ok, std::chrono::seconds timeout = 30s) const {
        const auto deadline = std::chrono::steady_clock::now() + timeout;
        while (std::chrono::steady_clock::now() < deadline) {
            if (ok(stats())) return true;
            std::this_thread::sleep_for(100ms);
        }
        return false;
    }
    // Idle: every connection seen has closed and its debug side finished,
    // and every difference is told apart (the mirror holds one for up to a
    // second before calling it a divergence rather than a reordering).
    bool wait_idle(std::uint64_t connections) const {
        return wait([&](const MirrorStats& s) {
            return s.connections.accepted >= connections && s.connections.active == 0 &&
                   s.connections.lingering_debug == 0 && s.divergence.unclassified == 0;
        });
    }
    void signal(int sig) { ::kill(child_.pid(), sig); }
    pid_t pid() const { return child_.pid(); }
    std::string log() const { return file_text(log_); }
    int stop() {
        child_.kill(SIGTERM);
        return child_.wait(10s);
    }

private:
    const Namespace& ns_;
    std::string log_;
    Child child_;
    int stats_port_ = 0;
};

// Clients in one namespace, production (and the mirror, and the debug copy
// on its loopback) in another, joined by a veth pair.
struct TwoHosts {
    const int id = static_cast<int>(::getpid() % 100000);
    Namespace clients{"ipcap-c" + std::to_string(id)};
    Namespace prod{"ipcap-p" + std::to_string(id)};
    const std::string client_if = "vc" + std::to_string(id), prod_if = "vp" + std::to_string(id);
    const std::string subnet = "10.216." + std::to_string(id % 250) + ".";
    const std::string client_ip = subnet + "1", prod_ip = subnet + "2";

    TwoHosts() {
        must({"ip", "link", "add", client_if, "netns", clients.name(), "type", "veth", "peer", "name", prod_if,
              "netns", prod.name()});
        must({"ip", "-n", clients.name(), "addr", "add", client_ip + "/30", "dev", client_if});
        must({"ip", "-n", prod.name(), "addr", "add", prod_ip + "/30", "dev", prod_if});
        must({"ip", "-n", clients.name(), "link", "set", client_if, "up"});
        must({"ip", "-n", prod.name(), "link", "set", prod_if, "up"});
    }
};

// A deterministic workload for one connection: keys of its own, so any
// interleaving of connections gives the same dataset.
std::string workload(int conn, int commands) {
    std::string out;
    for (int i = 0; i < commands; ++i) {
        const std::string key = "c" + std::to_string(conn) + ":k" + std::to_string(i % 2000);
        const std::string value = std::to_string(i * 7919 % 100003) + std::string(40, 'v');
        switch (i % 4) {
        case 0: out += resp_command({"SET", key, value}); break;
        case 1: out += resp_command({"INCR", "c" + std::to_string(conn) + ":counter"}); break;
        case 2: out += resp_command({"RPUSH", "c" + std::to_string(conn) + ":list", value}); break;
        default: out += resp_command({"GET", key}); break;
        }
    }
    return out;
}

// `connections` redis-cli --pipe clients in `ns` against ip:port, in parallel;
// each must get every reply.
void pipe_clients(const Namespace& ns, const TempDir& dir, const std::string& ip, int port, int connections,
                  int commands) {
    std::string script;
    for (int c = 0; c < connections; ++c) {
        const std::string file = dir / ("w" + std::to_string(c) + ".resp");
        std::ofstream(file, std::ios::binary) << workload(c, commands);
        script += "/usr/bin/redis-cli -h " + ip + " -p " + std::to_string(port) + " --pipe < " + file + " > " + file +
                  ".out 2>&1 &\n";
    }
    script += "wait\n";
    const auto r = run(ns.in({"sh", "-c", script}), {}, 300s);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    for (int c = 0; c < connections; ++c) {
        const std::string out = file_text(dir / ("w" + std::to_string(c) + ".resp.out"));
        ASSERT_NE(out.find("errors: 0, replies: " + std::to_string(commands)), std::string::npos) << out;
    }
}

// The commands both copies count, without the ones the test itself sends
// each of them directly (INFO, DEBUG, PING, CONFIG).
std::map<std::string, long long> workload_calls(std::map<std::string, long long> calls) {
    for (const char* own : {"info", "debug", "ping", "config|resetstat", "config|get", "flushall", "command|docs", "command"})
        calls.erase(own);
    return calls;
}

// Every connection direction the capture gave up, by its cause: they add up
// to the lost connections of both kinds (no loss without a cause).
std::uint64_t losses_by_cause(const MirrorStats::Capture& c) {
    std::uint64_t n = 0;
    for (const auto& [cause, count] : c.loss_causes) n += count;
    return n;
}

// Production (6379) and the copy (6390, on loopback) on the far side of the
// veth pair from the clients; the mirror runs beside them.
class CaptureMirror : public ::testing::Test {
protected:
    void SetUp() override {
        REQUIRE_TOOLS();
        hosts_ = std::make_unique<TwoHosts>();
        production_ = std::make_unique<RedisIn>(hosts_->prod, std::vector<std::string>{hosts_->prod_ip, "127.0.0.1"}, 6379);
        copy_ = std::make_unique<RedisIn>(hosts_->prod, std::vector<std::string>{"127.0.0.1"}, 6390);
    }

    TempDir dir;
    std::unique_ptr<TwoHosts> hosts_;
    std::unique_ptr<RedisIn> production_, copy_;
};

}  // namespace

TEST_F(CaptureMirror, ReorderedRetransmittedAndDuplicatedSegmentsReachTheCopyAsSent) {
    const TwoHosts& net = *hosts_;
    RedisIn &production = *production_, &copy = *copy_;
    std::vector<std::pair<const Namespace*, std::vector<std::string>>> disturbances;
    // Reordering: segments whose sequence number has bit 10 set wait in a
    // slow HTB class while the others overtake them (both directions).
    for (const auto& [ns, dev] : {std::pair{&net.clients, net.client_if}, std::pair{&net.prod, net.prod_if}}) {
        disturbances.push_back({ns, {"tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "10"}});
        disturbances.push_back({ns, {"tc", "class", "add", "dev", dev, "parent", "1:", "classid", "1:10", "htb", "rate", "10gbit"}});
        disturbances.push_back({ns, {"tc", "class", "add", "dev", dev, "parent", "1:", "classid", "1:20", "htb", "rate", "30mbit"}});
        disturbances.push_back({ns, {"tc", "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "u32", "match",
                                     "u32", "0x00000400", "0x00000400", "at", "24", "flowid", "1:20"}});
    }
    // Loss before the capture point (the capture sees the retransmission
    // only, late) and after it (the capture sees both copies), each way.
    for (const auto& [ns, chain, port_match] : {std::tuple{&net.clients, "OUTPUT", "--dport"},
                                                std::tuple{&net.prod, "INPUT", "--dport"},
                                                std::tuple{&net.prod, "OUTPUT", "--sport"},
                                                std::tuple{&net.clients, "INPUT", "--sport"}})
        disturbances.push_back({ns, {"iptables", "-A", chain, "-p", "tcp", port_match, "6379", "-m", "statistic",
                                     "--mode", "random", "--probability", "0.03", "-j", "DROP"}});
    // Duplicates on the wire.
    disturbances.push_back({&net.clients, {"iptables", "-t", "mangle", "-A", "POSTROUTING", "-p", "tcp", "--dport",
                                           "6379", "-m", "statistic", "--mode", "random", "--probability", "0.05",
                                           "-j", "TEE", "--gateway", net.prod_ip}});
    for (const auto& [ns, argv] : disturbances) {
        const auto r = run(ns->in(argv), {}, 30s);
        if (r.exit_code != 0)
            GTEST_SKIP() << "this kernel cannot disturb the path as the test needs (HTB and u32 qdiscs, iptables "
                            "statistic and TEE): `" << argv[0] << " " << argv[1] << " " << argv[2] << " ...`: " << r.err;
    }

    MirrorProcess m(net.prod, dir,
                    {"--capture", net.prod_if + ":6379", "--debug", "127.0.0.1:6390", "--divergence", "resp"});
    constexpr int kConns = 4, kCommands = 20000;
    pipe_clients(net.clients, dir, net.prod_ip, 6379, kConns, kCommands);
    ASSERT_TRUE(m.wait_idle(kConns)) << m.stats_text();

    const MirrorStats s = m.stats();
    ASSERT_TRUE(s.capture) << m.stats_text();
    EXPECT_EQ(s.capture->connections_from_start, static_cast<std::uint64_t>(kConns));
    EXPECT_EQ(s.capture->lost_connections, 0u) << m.stats_text();
    EXPECT_EQ(s.capture->lost_reply_connections, 0u) << m.stats_text();
    EXPECT_EQ(losses_by_cause(*s.capture), 0u) << m.stats_text();
    EXPECT_EQ(s.capture->kernel_drops, 0u);
    // The kernel did reorder, retransmit and duplicate.
    EXPECT_GT(s.capture->out_of_order_segments, 0u) << m.stats_text();
    EXPECT_GT(s.capture->retransmitted_bytes + s.capture->overlapping_bytes, 0u) << m.stats_text();
    // Byte for byte what the clients sent (redis-cli --pipe adds one 43-byte ECHO).
    std::size_t sent = 0;
    for (int c = 0; c < kConns; ++c) sent += workload(c, kCommands).size() + 43;
    EXPECT_EQ(s.bytes.client_to_production, sent);
    EXPECT_EQ(s.bytes.to_debug, sent);
    EXPECT_EQ(s.bytes.from_debug, s.bytes.production_to_client);
    EXPECT_EQ(s.divergence.compared, static_cast<std::uint64_t>(kConns * (kCommands + 1)));
    EXPECT_EQ(s.divergence.mismatches, 0u) << m.stats_text();
    EXPECT_EQ(s.debug.completed, static_cast<std::uint64_t>(kConns));
    // The copy ran every command production ran.
    EXPECT_EQ(workload_calls(copy.calls()), workload_calls(production.calls()));
    EXPECT_EQ(workload_calls(copy.calls())["set"], kConns * kCommands / 4);
    EXPECT_EQ(copy.digest(), production.digest());
    EXPECT_EQ(m.stop(), 0) << m.log();
}

TEST_F(CaptureMirror, ConnectionsOpenBeforeTheCaptureAreJoinedAtTheirNextCommand) {
    const TwoHosts& net = *hosts_;
    RedisIn& copy = *copy_;
    constexpr int kClients = 3, kCommands = 200;
    std::vector<std::unique_ptr<RespClient>> clients;
    for (int c = 0; c < kClients; ++c) {
        clients.push_back(std::make_unique<RespClient>(net.clients, net.prod_ip, 6379));
        // Production serves these before there is any capture: the copy never sees them.
        ASSERT_EQ(clients.back()->command({"SET", "before:" + std::to_string(c), std::string(3000, 'b')}), "+OK");
    }
    MirrorProcess m(net.prod, dir,
                    {"--capture", net.prod_if + ":6379", "--debug", "127.0.0.1:6390", "--divergence", "resp"});
    for (int i = 0; i < kCommands; ++i)
        for (int c = 0; c < kClients; ++c) {
            const std::string key = "after:" + std::to_string(c);
            ASSERT_EQ(clients[c]->command({"HSET", key, "f" + std::to_string(i), std::to_string(i)}), ":1");
            ASSERT_EQ(clients[c]->command({"HGET", key, "f" + std::to_string(i)}), std::to_string(i));
        }
    for (auto& c : clients) c->close();
    ASSERT_TRUE(m.wait_idle(kClients)) << m.stats_text();
    const MirrorStats s = m.stats();
    EXPECT_EQ(s.capture->connections_joined, static_cast<std::uint64_t>(kClients)) << m.stats_text();
    EXPECT_EQ(s.capture->connections_from_start, 0u);
    EXPECT_EQ(s.capture->lost_connections, 0u);
    EXPECT_EQ(s.divergence.compared, static_cast<std::uint64_t>(kClients * kCommands * 2));
    EXPECT_EQ(s.divergence.mismatches, 0u) << m.stats_text();
    // Every command from the join on, none from before.
    const auto copied = workload_calls(copy.calls());
    EXPECT_EQ(copied, (std::map<std::string, long long>{{"hset", kClients * kCommands}, {"hget", kClients * kCommands}}));
    EXPECT_EQ(copy.cli({"EXISTS", "before:0"}), "0");
    EXPECT_EQ(copy.cli({"HLEN", "after:2"}), std::to_string(kCommands));
    EXPECT_EQ(m.stop(), 0) << m.log();
}

// Redis' inline commands ("PING\r\n", what redis-cli typed, telnet and health
// checks send) join as multibulk ones do; a connection that says nothing is
// listed as joining, never invisible.
TEST_F(CaptureMirror, EveryRespFramingOfAnOpenConnectionJoinsAndAnIdleOneIsListed) {
    const TwoHosts& net = *hosts_;
    RedisIn& copy = *copy_;
    RespClient inline_client(net.clients, net.prod_ip, 6379), multibulk(net.clients, net.prod_ip, 6379),
        idle(net.clients, net.prod_ip, 6379);
    inline_client.send("PING\r\n");
    ASSERT_EQ(inline_client.reply(), "+PONG");
    ASSERT_EQ(multibulk.command({"PING"}), "+PONG");
    ASSERT_EQ(idle.command({"PING"}), "+PONG");
    MirrorProcess m(net.prod, dir,
                    {"--capture", net.prod_if + ":6379", "--debug", "127.0.0.1:6390", "--divergence", "resp"});
    constexpr int kCommands = 50;
    for (int i = 0; i < kCommands; ++i) {
        inline_client.send("SET inline:" + std::to_string(i) + " v" + std::to_string(i) + "\r\n");
        ASSERT_EQ(inline_client.reply(), "+OK");
        inline_client.send("PING\r\n");
        ASSERT_EQ(inline_client.reply(), "+PONG");
        ASSERT_EQ(multibulk.command({"SET", "multibulk:" + std::to_string(i), "v"}), "+OK");
    }
    ASSERT_TRUE(m.wait([](const MirrorStats& s) { return s.divergence.compared >= 3 * kCommands; })) << m.stats_text();
    MirrorStats s = m.stats();
    EXPECT_EQ(s.capture->connections_joined, 2u) << m.stats_text();
    EXPECT_EQ(s.capture->connections_joining, 1u) << m.stats_text();
    EXPECT_EQ(s.capture->connections_unjoinable, 0u);
    int listed_joining = 0;
    for (const auto& c : s.open_connections)
        if (c.captured && c.captured->status == "joining") ++listed_joining;
    EXPECT_EQ(listed_joining, 1) << m.stats_text();
    EXPECT_EQ(s.divergence.mismatches, 0u) << m.stats_text();
    EXPECT_EQ(copy.cli({"GET", "inline:49"}), "v49");
    EXPECT_EQ(copy.cli({"DBSIZE"}), std::to_string(2 * kCommands));
    // The idle connection speaks at last: joined then.
    ASSERT_EQ(idle.command({"SET", "idle", "1"}), "+OK");
    ASSERT_TRUE(m.wait([](const MirrorStats& s) { return s.capture->connections_joined == 3; })) << m.stats_text();
    EXPECT_EQ(m.stats().capture->connections_joining, 0u);
    EXPECT_EQ(m.stop(), 0) << m.log();
}

TEST_F(CaptureMirror, CaptureLossEndsOnlyTheConnectionThatLostBytes) {
    const TwoHosts& net = *hosts_;
    RedisIn &production = *production_, &copy = *copy_;
    // A small ring (16 blocks), and a reader stopped while one connection
    // sends more than it holds: the kernel drops what does not fit.
    MirrorProcess m(net.prod, dir,
                    {"--capture", net.prod_if + ":6379", "--capture-buffer", "4M", "--debug", "127.0.0.1:6390",
                     "--divergence", "resp"});
    RespClient quiet(net.clients, net.prod_ip, 6379), loud(net.clients, net.prod_ip, 6379);
    for (int i = 0; i < 10; ++i) ASSERT_EQ(quiet.command({"HSET", "quiet", "f" + std::to_string(i), "v"}), ":1");
    ASSERT_EQ(loud.command({"SET", "loud:start", "1"}), "+OK");
    ASSERT_TRUE(m.wait([](const MirrorStats& s) { return s.bytes.from_debug > 0 && s.connections.accepted == 2; }));

    m.signal(SIGSTOP);
    constexpr int kPushes = 200000;  // 26 MB
    std::string burst;
    for (int i = 0; i < kPushes; ++i) burst += resp_command({"RPUSH", "loud", std::string(100, 'x')});
    std::thread reader([&] {
        for (int i = 0; i < kPushes; ++i) loud.reply();
    });
    loud.send(burst);
    reader.join();
    m.signal(SIGCONT);
    // Once the mirror has read what its ring kept and counted the drops (and
    // the ring takes packets again), the loud connection goes on: what
    // production's acknowledgments then say it received proves the capture
    // lost bytes of it.  (Had the connection said nothing more, its lost tail
    // would be known only from the kernel's drop count.)
    ASSERT_TRUE(m.wait([](const MirrorStats& s) { return s.capture->kernel_drops > 0; })) << m.stats_text();
    std::this_thread::sleep_for(100ms);
    for (int i = 0; i < 10; ++i) ASSERT_EQ(loud.command({"SET", "loud:after", std::to_string(i)}), "+OK");
    ASSERT_TRUE(m.wait([](const MirrorStats& s) { return s.capture->lost_connections >= 1; })) << m.stats_text();
    for (int i = 10; i < 30; ++i) ASSERT_EQ(quiet.command({"HSET", "quiet", "f" + std::to_string(i), "v"}), ":1");
    quiet.close();
    loud.close();
    ASSERT_TRUE(m.wait_idle(2)) << m.stats_text();

    const MirrorStats s = m.stats();
    EXPECT_GT(s.capture->kernel_drops, 0u);
    EXPECT_EQ(s.capture->lost_connections, 1u) << m.stats_text();
    EXPECT_EQ(losses_by_cause(*s.capture), s.capture->lost_connections + s.capture->lost_reply_connections)
        << m.stats_text();
    EXPECT_EQ(s.capture->loss_causes.size(), 6u) << m.stats_text();
    // The quiet connection lost nothing: the copy ran each of its commands.
    EXPECT_EQ(copy.cli({"HLEN", "quiet"}), "30");
    EXPECT_EQ(copy.calls()["hset"], 30);
    EXPECT_EQ(s.divergence.mismatches, 0u) << m.stats_text();
    // The loud one was never fed a stream with a hole: a prefix of its pushes.
    EXPECT_EQ(production.cli({"LLEN", "loud"}), std::to_string(kPushes));
    const long long copied = std::stoll(copy.cli({"LLEN", "loud"}));
    EXPECT_LT(copied, kPushes);
    EXPECT_EQ(copy.calls()["rpush"], copied);
    EXPECT_NE(m.log().find("client bytes lost to the capture"), std::string::npos) << m.log();
    EXPECT_EQ(m.stop(), 0) << m.log();
}

// The same loss, but the loud connection says nothing more afterwards: no
// acknowledgment shows the hole, so the capture asks production's own socket
// how many bytes it received.
TEST_F(CaptureMirror, ASilentConnectionsLossIsFoundFromProductionsSocket) {
    const TwoHosts& net = *hosts_;
    RedisIn& copy = *copy_;
    MirrorProcess m(net.prod, dir,
                    {"--capture", net.prod_if + ":6379", "--capture-buffer", "4M", "--debug", "127.0.0.1:6390",
                     "--divergence", "resp"});
    RespClient quiet(net.clients, net.prod_ip, 6379), loud(net.clients, net.prod_ip, 6379);
    for (int i = 0; i < 10; ++i) ASSERT_EQ(quiet.command({"HSET", "quiet", "f" + std::to_string(i), "v"}), ":1");
    ASSERT_EQ(loud.command({"SET", "loud:start", "1"}), "+OK");
    ASSERT_TRUE(m.wait([](const MirrorStats& s) { return s.bytes.from_debug > 0 && s.connections.accepted == 2; }));

    m.signal(SIGSTOP);
    constexpr int kPushes = 200000;
    std::string burst;
    for (int i = 0; i < kPushes; ++i) burst += resp_command({"RPUSH", "loud", std::string(100, 'x')});
    std::thread reader([&] {
        for (int i = 0; i < kPushes; ++i) loud.reply();
    });
    loud.send(burst);
    reader.join();
    m.signal(SIGCONT);
    ASSERT_TRUE(m.wait([](const MirrorStats& s) { return s.capture->lost_connections >= 1; })) << m.stats_text();
    MirrorStats s = m.stats();
    EXPECT_GT(s.capture->kernel_drops, 0u);
    EXPECT_EQ(s.capture->checked_with_production, 2u) << m.stats_text();
    EXPECT_EQ(s.capture->lost_connections, 1u) << m.stats_text();
    // Found from production's socket, and said so.
    EXPECT_EQ(s.capture->loss_causes.at("production_received_more"), 1u) << m.stats_text();
    EXPECT_EQ(losses_by_cause(*s.capture), 1u) << m.stats_text();
    for (int i = 10; i < 30; ++i) ASSERT_EQ(quiet.command({"HSET", "quiet", "f" + std::to_string(i), "v"}), ":1");
    quiet.close();
    loud.close();
    ASSERT_TRUE(m.wait_idle(2)) << m.stats_text();
    s = m.stats();
    EXPECT_EQ(s.capture->lost_connections, 1u) << m.stats_text();
    EXPECT_EQ(copy.cli({"HLEN", "quiet"}), "30");
    EXPECT_LT(std::stoll(copy.cli({"LLEN", "loud"})), kPushes);
    EXPECT_NE(m.log().find("client bytes lost to the capture (production's socket received more than the capture "
                           "saw)"),
              std::string::npos)
        << m.log();
    EXPECT_EQ(m.stop(), 0) << m.log();
}

TEST(CaptureMirrorLoopback, BenchmarkTrafficReachesTheCopyCommandForCommand) {
    REQUIRE_TOOLS();
    TempDir dir;
    Namespace ns("ipcap-l" + std::to_string(::getpid() % 100000));
    RedisIn production(ns, {"127.0.0.1"}, 6379);
    RedisIn copy(ns, {"127.0.0.1"}, 6390);
    // No divergence checking: what INCR and LPUSH answer depends on how the
    // benchmark's connections interleave on one server.
    MirrorProcess m(ns, dir, {"--capture", "lo:6379", "--debug", "127.0.0.1:6390"});
    for (const char* pipeline : {"1", "16"}) {
        const auto r = run(ns.in({"/usr/bin/redis-benchmark", "-p", "6379", "-t", "set,incr,lpush", "-n", "20000",
                                  "-c", "10", "-P", pipeline, "-r", "1000", "-q"}),
                           {}, 300s);
        ASSERT_EQ(r.exit_code, 0) << r.err;
    }
    // Each run: 10 clients for each of 3 tests, and one for the server's config.
    constexpr std::uint64_t kConnections = 2 * (3 * 10 + 1);
    ASSERT_TRUE(m.wait_idle(kConnections)) << m.stats_text();
    const MirrorStats s = m.stats();
    EXPECT_EQ(s.connections.accepted, kConnections);
    EXPECT_EQ(s.capture->lost_connections, 0u);
    EXPECT_EQ(s.capture->kernel_drops, 0u);
    EXPECT_EQ(s.bytes.to_debug, s.bytes.client_to_production);
    EXPECT_EQ(s.bytes.from_debug, s.bytes.production_to_client);
    const auto copied = workload_calls(copy.calls());
    EXPECT_EQ(copied, workload_calls(production.calls()));
    EXPECT_EQ(copied.at("set"), 2 * 20000);
    EXPECT_EQ(copied.at("lpush"), 2 * 20000);
    EXPECT_EQ(m.stop(), 0) << m.log();
}

TEST(CaptureMirrorLoopback, ACopyHoldingDifferentDataIsReportedWithTheRequest) {
    REQUIRE_TOOLS();
    TempDir dir;
    Namespace ns("ipcap-d" + std::to_string(::getpid() % 100000));
    RedisIn production(ns, {"127.0.0.1", "::1"}, 6379);
    RedisIn copy(ns, {"127.0.0.1"}, 6390);
    ASSERT_EQ(production.cli({"SET", "user:42", "alice"}), "OK");
    ASSERT_EQ(copy.cli({"SET", "user:42", "mallory"}), "OK");
    MirrorProcess m(ns, dir, {"--capture", "lo:6379", "--debug", "127.0.0.1:6390", "--divergence", "resp"});
    // Over IPv6 loopback: the capture reads both families.
    auto r = run(ns.in({"/usr/bin/redis-cli", "-h", "::1", "-p", "6379", "GET", "user:42"}));
    EXPECT_EQ(r.out, "alice\n");
    r = run(ns.in({"/usr/bin/redis-cli", "-h", "127.0.0.1", "-p", "6379", "SET", "user:7", "bob"}));
    EXPECT_EQ(r.out, "OK\n");
    ASSERT_TRUE(m.wait_idle(2)) << m.stats_text();
    const MirrorStats s = m.stats();
    EXPECT_EQ(s.divergence.compared, 2u);
    EXPECT_EQ(s.divergence.mismatches, 1u);
    EXPECT_EQ(s.divergence.diverged_connections, 1u);
    ASSERT_EQ(s.divergence.reports.size(), 1u) << m.stats_text();
    EXPECT_EQ(s.divergence.reports[0].request, "GET user:42");
    EXPECT_EQ(s.divergence.reports[0].production, "$5\r\nalice\r\n");
    EXPECT_EQ(s.divergence.reports[0].debug, "$7\r\nmallory\r\n");
    EXPECT_EQ(copy.cli({"GET", "user:7"}), "bob");
    EXPECT_EQ(m.stop(), 0) << m.log();
}

// The share of the CPU time a process was ready to use that it may spend
// waiting on a run queue on a machine left to the test (the test's five
// processes on two cores): above it, other work had the cores.
constexpr double kBusyMachine = 0.5;

// Several copies (iprobe debug --clones N): each gets the whole captured
// stream through a buffer of its own and is compared with production on its own.
TEST(CaptureMirrorLoopback, EachDebugCopyGetsTheWholeCapturedStreamAndIsComparedOnItsOwn) {
    REQUIRE_TOOLS();
    TempDir dir;
    Namespace ns("ipcap-n" + std::to_string(::getpid() % 100000));
    RedisIn production(ns, {"127.0.0.1"}, 6379);
    RedisIn same(ns, {"127.0.0.1"}, 6390);
    RedisIn different(ns, {"127.0.0.1"}, 6391);
    ASSERT_EQ(production.cli({"SET", "user:42", "alice"}), "OK");
    ASSERT_EQ(same.cli({"SET", "user:42", "alice"}), "OK");
    ASSERT_EQ(different.cli({"SET", "user:42", "mallory"}), "OK");
    MirrorProcess m(ns, dir,
                    {"--capture", "lo:6379", "--debug", "127.0.0.1:6390", "--debug", "127.0.0.1:6391",
                     "--divergence", "resp"});
    // SET answers OK whatever the interleaving, so only user:42 can differ.
    const CpuTimes before = cpu_times(m.pid());
    const auto started = std::chrono::steady_clock::now();
    const auto r = run(ns.in({"/usr/bin/redis-benchmark", "-p", "6379", "-t", "set", "-n", "10000", "-c", "5", "-r",
                              "1000", "-q"}),
                       {}, 300s);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(production.cli({"GET", "user:42"}), "alice");
    // redis-benchmark's 5 clients and the one it reads the server's config
    // on, then that GET: idle only once the capture has seen all 7, or the
    // GET's connection may be seen just after and still be open here.
    constexpr std::uint64_t kConnections = 5 + 1 + 1;
    const bool idle = m.wait_idle(kConnections);
    const CpuTimes after = cpu_times(m.pid());
    const auto wall_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - started).count();
    const MirrorStats s = m.stats();
    // A capacity test: both copies must keep up with production on the same
    // two cores.  When they did not and the mirror got less of a CPU than it
    // was ready to use, other work had the machine: say so, not fail.
    bool kept_up = idle && s.capture->lost_connections == 0;
    for (const auto& t : s.debug_targets) kept_up = kept_up && t.overflows == 0;
    const double on_cpu_ms = static_cast<double>(after.on_cpu_ns - before.on_cpu_ns) / 1e6;
    const double waiting_ms = static_cast<double>(after.waiting_ns - before.waiting_ns) / 1e6;
    const double denied = waiting_ms / std::max(on_cpu_ms + waiting_ms, 1e-3);
    std::printf("mirror: %.0f ms on a CPU, %.0f ms runnable but waiting for one (%.0f%%), in %.0f ms\n", on_cpu_ms,
                waiting_ms, 100 * denied, static_cast<double>(wall_ns) / 1e6);
    if (!kept_up && denied > kBusyMachine)
        GTEST_SKIP() << "the machine was too busy to judge: the mirror waited for a CPU " << waiting_ms << " ms and ran "
                     << on_cpu_ms << " ms (denied " << static_cast<int>(100 * denied) << "% of what it asked, over "
                     << static_cast<int>(100 * kBusyMachine) << "%), and fell behind: " << m.stats_text();
    ASSERT_TRUE(idle) << m.stats_text();
    EXPECT_EQ(s.connections.accepted, kConnections);
    EXPECT_EQ(s.capture->lost_connections, 0u);
    ASSERT_EQ(s.debug_targets.size(), 2u) << m.stats_text();
    EXPECT_EQ(s.debug_targets[0].address, "127.0.0.1:6390");
    EXPECT_EQ(s.debug_targets[1].address, "127.0.0.1:6391");
    for (const auto& t : s.debug_targets) {
        EXPECT_EQ(t.bytes, s.bytes.client_to_production) << t.address;
        EXPECT_EQ(t.overflows, 0u) << t.address;
        EXPECT_EQ(t.open_legs, 0u) << t.address;
    }
    EXPECT_EQ(s.bytes.to_debug, 2 * s.bytes.client_to_production);
    EXPECT_EQ(workload_calls(same.calls()).at("set"), 10000 + 1);
    EXPECT_EQ(workload_calls(different.calls()).at("set"), 10000 + 1);
    EXPECT_EQ(s.debug_targets[0].diverged_connections, 0u);
    EXPECT_EQ(s.debug_targets[1].diverged_connections, 1u);
    EXPECT_EQ(s.divergence.diverged_connections, 1u);
    ASSERT_EQ(s.divergence.reports.size(), 1u) << m.stats_text();
    EXPECT_EQ(s.divergence.reports[0].debug_target, 1u);
    EXPECT_EQ(s.divergence.reports[0].request, "GET user:42");
    EXPECT_EQ(s.divergence.reports[0].debug, "$7\r\nmallory\r\n");
    EXPECT_EQ(m.stop(), 0) << m.log();
}

TEST(CaptureMirrorLoopback, ARecordedCaptureReplaysIntoTheSameDataset) {
    REQUIRE_TOOLS();
    TempDir dir;
    Namespace ns("ipcap-r" + std::to_string(::getpid() % 100000));
    RedisIn production(ns, {"127.0.0.1"}, 6379);
    RedisIn fresh(ns, {"127.0.0.1"}, 6390);
    const std::string rec = dir / "traffic.rec";
    {
        // No copy to feed: the capture records what production's clients sent.
        MirrorProcess m(ns, dir, {"--capture", "lo:6379", "--record", rec});
        pipe_clients(ns, dir, "127.0.0.1", 6379, 3, 5000);
        ASSERT_TRUE(m.wait_idle(3)) << m.stats_text();
        EXPECT_EQ(m.stats().capture->connections_from_start, 3u);
        EXPECT_EQ(m.stop(), 0) << m.log();  // the recording is complete once the mirror exits
    }
    const auto r = run(ns.in({bin("iprobe"), "replay", rec, "--to", "127.0.0.1:6390", "--speed", "0", "--json"}));
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("\"connections\":3"), std::string::npos) << r.out;
    EXPECT_EQ(fresh.digest(), production.digest());
    EXPECT_EQ(workload_calls(fresh.calls()), workload_calls(production.calls()));
}

TEST(CaptureMirrorCli, UsageErrorsAndMissingInterfaces) {
    const auto mirror = [](std::vector<std::string> args) {
        args.insert(args.begin(), {bin("iprobe"), "mirror"});
        return run(args, {}, 10s);
    };
    auto r = mirror({"--capture", "lo:6379", "--listen", "127.0.0.1:0", "--debug", "127.0.0.1:1"});
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find("--capture takes no --listen"), std::string::npos) << r.err;
    r = mirror({"--capture", "lo:6379", "--production", "127.0.0.1:1"});
    EXPECT_EQ(r.exit_code, 2);
    r = mirror({"--capture", "lo:0", "--debug", "127.0.0.1:1"});
    EXPECT_EQ(r.exit_code, 2);
    r = mirror({"--capture", "lo:http", "--debug", "127.0.0.1:1"});
    EXPECT_EQ(r.exit_code, 2);
    r = mirror({"--capture", "lo:6379", "--debug", "127.0.0.1:1", "--join", "xml"});
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find("--join 'xml'"), std::string::npos) << r.err;
    r = mirror({"--listen", "127.0.0.1:0", "--production", "127.0.0.1:1", "--join", "resp"});
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find("--join belongs to --capture"), std::string::npos) << r.err;
    if (is_root()) {
        r = mirror({"--capture", "nosuchif0:6379", "--debug", "127.0.0.1:1"});
        EXPECT_EQ(r.exit_code, 5);
        EXPECT_NE(r.err.find("no interface 'nosuchif0'"), std::string::npos) << r.err;
    }
    r = mirror({"--help"});
    EXPECT_NE(r.out.find("--capture [IFACE:]PORT"), std::string::npos);
}
