#include "redis_fixture.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <regex>
#include <sstream>

namespace iprobe::test {

Netns::Netns(std::string name) : name_(std::move(name)) {
    run({"ip", "netns", "delete", name_});
    auto r = run({"ip", "netns", "add", name_});
    if (r.exit_code != 0) throw std::runtime_error("ip netns add " + name_ + ": " + r.err);
    run({"ip", "-n", name_, "link", "set", "lo", "up"});
}

Netns::~Netns() { run({"ip", "netns", "delete", name_}); }

bool netns_exists(const std::string& name) { return std::filesystem::exists("/run/netns/" + name); }

int connect_in_netns(const std::string& netns_path, int port) {
    int fd = -1;
    std::thread t([&] {
        int ns = ::open(netns_path.c_str(), O_RDONLY | O_CLOEXEC);
        if (ns < 0) return;
        if (::setns(ns, CLONE_NEWNET) != 0) {
            ::close(ns);
            return;
        }
        ::close(ns);
        int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in addr{};
        addr.sin_family = AF_INET;
        addr.sin_port = htons(static_cast<uint16_t>(port));
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (::connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0)
            fd = s;
        else
            ::close(s);
    });
    t.join();
    return fd;
}

std::string json_string(const std::string& json, const std::string& key) {
    std::smatch m;
    if (!std::regex_search(json, m, std::regex("\"" + key + "\":\"([^\"]*)\""))) return {};
    return m[1];
}

std::vector<std::string> events(const std::string& path, const std::string& event) {
    std::vector<std::string> out;
    std::istringstream lines(file_text(path));
    std::string line;
    while (std::getline(lines, line))
        if (line.find("\"event\":\"" + event + "\"") != std::string::npos) out.push_back(line);
    return out;
}

bool wait_for_event(const std::string& path, const std::string& event, size_t count, Child& debug,
                    std::chrono::seconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
        if (events(path, event).size() >= count) return true;
        if (!debug.running()) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
}

size_t count_lines_with(const std::string& text, const std::string& needle) {
    size_t n = 0;
    std::istringstream lines(text);
    std::string line;
    while (std::getline(lines, line))
        if (line.find(needle) != std::string::npos) ++n;
    return n;
}

std::string finstrument_redis() {
    std::string out = build_dir() + "/redis/finstrument";
    std::string server = out + "/src/redis-server";
    if (std::filesystem::exists(server) && std::filesystem::exists(server + ".probes")) return server;
    auto r = run({source_dir() + "/scripts/build-redis", "--mode", "finstrument", out}, {}, std::chrono::seconds(900),
                 {"IPROBE_BUILD_DIR=" + build_dir()});
    if (r.exit_code != 0) return {};
    return server;
}

std::string trim(std::string s) {
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
    return s;
}

std::string redis_cli(const std::string& netns_path, int port, const std::vector<std::string>& args) {
    std::vector<std::string> argv = {"nsenter", "--net=" + netns_path, "redis-cli", "-p", std::to_string(port)};
    argv.insert(argv.end(), args.begin(), args.end());
    auto r = run(argv, {}, std::chrono::seconds(30));
    return trim(r.out);
}

std::string redis_cli_x(const std::string& netns_path, int port, const std::vector<std::string>& args,
                        const std::string& last_arg) {
    std::vector<std::string> argv = {"nsenter", "--net=" + netns_path, "redis-cli", "-p", std::to_string(port), "-x"};
    argv.insert(argv.end(), args.begin(), args.end());
    return trim(run(argv, last_arg, std::chrono::seconds(30)).out);
}

Redis::Redis(const std::string& netns_path, int port, const std::string& dir, const std::string& binary,
             const std::vector<std::string>& extra)
    : netns_path_(netns_path), port_(port) {
    std::vector<std::string> argv = {"nsenter", "--net=" + netns_path, binary, "--port", std::to_string(port),
                                     "--save", "", "--appendonly", "no", "--daemonize", "no",
                                     "--dir", dir, "--logfile", dir + "/redis.log",
                                     "--enable-debug-command", "yes"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    // Led by itself, as a daemon or a systemd service is: CRIU cannot dump a
    // process whose session leader is outside its PID namespace.
    child_ = Child(argv, "/dev/null", {}, Session::own);
}

bool redis_answers(const std::string& netns_path, int port, std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
        if (redis_cli(netns_path, port, {"PING"}) == "PONG") return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
}

bool Redis::ready(std::chrono::milliseconds timeout) { return redis_answers(netns_path_, port_, timeout); }

IncrLoop::IncrLoop(const std::string& netns_path, int port, std::string key) : key_(std::move(key)) {
    fd_ = connect_in_netns(netns_path, port);
    if (fd_ < 0) {
        error_ = "cannot connect";
        return;
    }
    thread_ = std::thread([this] { loop(); });
}

IncrLoop::~IncrLoop() {
    stop();
    if (fd_ >= 0) ::close(fd_);
}

void IncrLoop::stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
}

void IncrLoop::loop() {
    const std::string cmd = "*2\r\n$4\r\nINCR\r\n$" + std::to_string(key_.size()) + "\r\n" + key_ + "\r\n";
    long long previous = -1;
    while (!stop_) {
        auto start = std::chrono::steady_clock::now();
        if (::send(fd_, cmd.data(), cmd.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(cmd.size())) {
            error_ = std::string("send: ") + std::strerror(errno);
            return;
        }
        std::string reply;
        while (reply.find("\r\n") == std::string::npos) {
            pollfd p{fd_, POLLIN, 0};
            if (::poll(&p, 1, 5000) <= 0) {
                error_ = "no reply within 5 s";
                return;
            }
            char buf[64];
            ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
            if (n <= 0) {
                error_ = n == 0 ? "connection closed" : std::string("recv: ") + std::strerror(errno);
                return;
            }
            reply.append(buf, static_cast<size_t>(n));
        }
        double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
        if (ms > max_latency_ms_) max_latency_ms_ = ms;
        if (reply[0] != ':') {
            error_ = "unexpected reply " + reply;
            return;
        }
        long long v = std::stoll(reply.substr(1));
        if (previous >= 0 && v != previous + 1) {
            error_ = "INCR went from " + std::to_string(previous) + " to " + std::to_string(v);
            return;
        }
        previous = v;
        ++replies_;
    }
}

long long json_number(const std::string& json, const std::string& key) {
    std::smatch m;
    std::regex re("\"" + key + "\":(-?[0-9]+)");
    if (!std::regex_search(json, m, re)) return -1;
    return std::stoll(m[1]);
}

}  // namespace iprobe::test
