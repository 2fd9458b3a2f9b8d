#include "client_pinger.h"

#include <cstdio>

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include "iprobe/proxy/address.h"
#include "iprobe/support/error.h"
#include "iprobe/support/fd.h"
#include "iprobe/support/proc.h"
#include "process.h"

namespace iprobe::launcher {
namespace {

constexpr char kPing[] = "PING\r\n";
constexpr char kPong[] = "+PONG\r\n";

// One PING answered within `timeout_ms`; false on error or silence.
bool ping(int fd, int timeout_ms) {
    if (::send(fd, kPing, sizeof kPing - 1, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof kPing - 1)) return false;
    std::size_t got = 0;
    char buf[sizeof kPong];
    while (got < sizeof kPong - 1) {
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, timeout_ms) <= 0) return false;
        const ssize_t n = ::read(fd, buf + got, sizeof kPong - 1 - got);
        if (n <= 0) return false;
        got += static_cast<std::size_t>(n);
    }
    return std::equal(buf, buf + got, kPong);
}

double percentile(std::vector<double> v, double p) {
    if (v.empty()) return 0;
    const auto k = static_cast<std::size_t>(std::ceil(p * static_cast<double>(v.size()))) - 1;
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(std::min(k, v.size() - 1)), v.end());
    return v[std::min(k, v.size() - 1)];
}

}  // namespace

std::string protocol_of_service(pid_t pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/comm");
    std::string comm;
    std::getline(in, comm);
    for (const char* resp : {"redis-server", "keydb-server", "valkey-server", "redis-check-aof"})
        if (comm == resp) return "resp";
    for (const char* http : {"nginx", "httpd", "apache2", "lighttpd", "caddy", "h2o", "varnishd"})
        if (comm == http) return "http";
    return {};
}

std::unique_ptr<ClientPinger> ClientPinger::watch(pid_t pid) {
    if (protocol_of_service(pid) != "resp") return nullptr;
    const auto listeners = proc::tcp_listeners(pid);
    if (listeners.empty()) return nullptr;
    const std::string host = listeners.front().address == "0.0.0.0" ? "127.0.0.1" : listeners.front().address;
    return start(host + ":" + std::to_string(listeners.front().port), std::chrono::milliseconds(1),
                 "/proc/" + std::to_string(pid) + "/ns/net");
}

std::unique_ptr<ClientPinger> ClientPinger::start(const std::string& address, std::chrono::microseconds interval,
                                                  const std::string& netns) {
    try {
        UniqueFd fd;
        if (netns.empty()) {
            fd = proxy::start_connect(proxy::parse_endpoint(address, "production"));
        } else {
            // A socket stays in the namespace it was made in: made by a
            // thread that joined production's.
            const proxy::Endpoint to = proxy::parse_endpoint(address, "production");
            std::thread([&] {
                UniqueFd ns(::open(netns.c_str(), O_RDONLY | O_CLOEXEC));
                if (ns && ::setns(ns.get(), CLONE_NEWNET) == 0) fd = proxy::start_connect(to);
            }).join();
        }
        pollfd p{fd.get(), POLLOUT, 0};
        int error = 0;
        socklen_t len = sizeof error;
        if (!fd || ::poll(&p, 1, 2000) <= 0 || ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error, &len) != 0 ||
            error != 0)
            return nullptr;
        if (!ping(fd.get(), 2000)) return nullptr;
        return std::unique_ptr<ClientPinger>(new ClientPinger(fd.release(), interval));
    } catch (const Error&) {
        return nullptr;
    }
}

ClientPinger::ClientPinger(int fd, std::chrono::microseconds interval)
    : fd_(fd), interval_us_(interval.count()), thread_([this] { loop(); }) {}

ClientPinger::~ClientPinger() {
    stop_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    thread_.join();
    ::close(fd_);
}

void ClientPinger::loop() {
    // Signals are the launcher's to handle (its InterruptGuard, signalfd).
    sigset_t all;
    sigfillset(&all);
    ::pthread_sigmask(SIG_BLOCK, &all, nullptr);
    while (!stop_) {
        const double sent = now_ms() * 1e3;
        {
            std::lock_guard lock(m_);
            outstanding_since_us_ = sent;
        }
        const bool ok = ping(fd_, 10000);
        const double took = now_ms() * 1e3 - sent;
        {
            std::lock_guard lock(m_);
            outstanding_since_us_ = -1;
            if (ok) {
                all_us_.push_back(took);
                window_max_us_ = std::max(window_max_us_, took);
            }
        }
        if (!ok) return;  // production closed it or stopped answering: no more samples
        std::this_thread::sleep_for(std::chrono::microseconds(interval_us_.load()));
    }
}

void ClientPinger::begin_window() {
    std::lock_guard lock(m_);
    window_max_us_ = 0;
}

double ClientPinger::window_max_us() {
    std::lock_guard lock(m_);
    const double outstanding = outstanding_since_us_ < 0 ? 0 : now_ms() * 1e3 - outstanding_since_us_;
    return std::max(window_max_us_, outstanding);
}

ClientPinger::Latency ClientPinger::latency() {
    std::lock_guard lock(m_);
    Latency l;
    l.samples = all_us_.size();
    l.p50_us = percentile(all_us_, 0.5);
    l.p99_us = percentile(all_us_, 0.99);
    l.max_us = all_us_.empty() ? 0 : *std::max_element(all_us_.begin(), all_us_.end());
    return l;
}

void say_client_seen(bool json, double client_seen_us) {
    if (client_seen_us >= 0 && !json)
        std::fprintf(stderr, "iprobe debug: a client of production waited at most %.1f ms for a reply meanwhile "
                             "(a PING every 1 ms)\n",
                     client_seen_us / 1e3);
}

}  // namespace iprobe::launcher
