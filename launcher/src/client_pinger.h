// Production as one of its clients sees it: a connection of its own to the
// service, a RESP PING on it every `interval` and the time each reply took.
// Around a checkpoint (every 1 ms) the longest wait is the freeze the
// clients felt, podman's or CRIU's stopping phase included, which CRIU's own
// frozen_time leaves out; through a session (every 10 ms) the replies give
// production's latency percentiles.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace iprobe::launcher {

class ClientPinger {
public:
    // Connects to `address` (ADDR:PORT, in the caller's network namespace);
    // null when the service does not answer a PING there.
    static std::unique_ptr<ClientPinger> start(const std::string& address, std::chrono::microseconds interval);
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
