// Production as one of its clients sees it: a connection of its own to the
// service, a RESP PING on it every `interval` and the time each reply took.
// Around a checkpoint (every 1 ms) the longest wait is the freeze the
// clients felt, podman's or CRIU's stopping phase included, which CRIU's own
// frozen_time leaves out; through a session (every 10 ms) the replies give
// production's latency percentiles.
#pragma once

#include <atomic>
#include <sys/types.h>

#include <chrono>
#include <memory>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace iprobe::launcher {

// The reply protocol of a service known by its program ("resp" for redis
// and its kin, "http" for web servers); empty when unknown.
std::string protocol_of_service(pid_t pid);

// `iprobe debug`'s line for people (none with --json) on the longest wait
// a client of production saw around a checkpoint (-1: not measured).
void say_client_seen(bool json, double client_seen_us);

class ClientPinger {
public:
    // Connects to `address` (ADDR:PORT, in the caller's network namespace);
    // null when the service does not answer a PING there.
    // `netns`: a network namespace to connect from (/proc/PID/ns/net); empty:
    // the caller's.
    static std::unique_ptr<ClientPinger> start(const std::string& address, std::chrono::microseconds interval,
                                               const std::string& netns = {});
    // A PING every millisecond to the service `pid` is, from inside its
    // network namespace, on the first port it listens on; null when it is
    // not a RESP service (by its program) or listens on no TCP port.
    static std::unique_ptr<ClientPinger> watch(pid_t pid);
    ~ClientPinger();
    ClientPinger(const ClientPinger&) = delete;
    ClientPinger& operator=(const ClientPinger&) = delete;

    void set_interval(std::chrono::microseconds interval) { interval_us_ = interval.count(); }
    // Starts a new window; window_max_us() is the longest reply (or a reply
    // still outstanding, counted up to now) since then.
    void begin_window();
    double window_max_us();
    struct Latency {
        std::uint64_t samples = 0;
        double p50_us = 0, p99_us = 0, max_us = 0;
    };
    Latency latency();  // every reply since start

private:
    explicit ClientPinger(int fd, std::chrono::microseconds interval);
    void loop();

    int fd_;
    std::atomic<long long> interval_us_;
    std::atomic<bool> stop_{false};
    std::mutex m_;
    std::vector<double> all_us_;
    double window_max_us_ = 0;
    double outstanding_since_us_ = -1;  // a PING sent, not answered yet
    std::thread thread_;
};

}  // namespace iprobe::launcher
