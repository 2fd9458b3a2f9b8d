// Shared by the launcher suites: a network namespace per test, a real
// redis-server started inside it with nsenter, and clients that talk to it.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "testutil.h"

namespace iprobe::test {

// `ip netns add NAME` with loopback up; deleted on destruction.
class Netns {
public:
    explicit Netns(std::string name);
    ~Netns();
    Netns(const Netns&) = delete;
    Netns& operator=(const Netns&) = delete;
    const std::string& name() const { return name_; }
    std::string path() const { return "/run/netns/" + name_; }

private:
    std::string name_;
};

bool netns_exists(const std::string& name);

// A TCP connection to 127.0.0.1:port inside the namespace at `netns_path`
// (made from a thread that joined the namespace; sockets stay where they
// were created).  Returns -1 on failure.
int connect_in_netns(const std::string& netns_path, int port);

// One RESP command, reply as redis-cli prints it (--no-raw off: raw strings).
std::string redis_cli(const std::string& netns_path, int port, const std::vector<std::string>& args);

// Polls until the redis on `port` in the namespace answers PING.
bool redis_answers(const std::string& netns_path, int port,
                   std::chrono::milliseconds timeout = std::chrono::seconds(10));

// The same with stdin as the command's last argument (redis-cli -x), for
// values larger than an exec argument may be.
std::string redis_cli_x(const std::string& netns_path, int port, const std::vector<std::string>& args,
                        const std::string& last_arg);

// redis-server on `port` inside a namespace, its directory `dir`.
class Redis {
public:
    Redis(const std::string& netns_path, int port, const std::string& dir,
          const std::string& binary = "/usr/bin/redis-server", const std::vector<std::string>& extra = {});
    pid_t pid() const { return child_.pid(); }
    bool ready(std::chrono::milliseconds timeout = std::chrono::seconds(10));
    std::string cli(const std::vector<std::string>& args) const { return redis_cli(netns_path_, port_, args); }
    int port() const { return port_; }

private:
    std::string netns_path_;
    int port_;
    Child child_;
};

// A client issuing INCR on one connection as fast as replies come back,
// checking each reply is the previous + 1, until stopped.
class IncrLoop {
public:
    IncrLoop(const std::string& netns_path, int port, std::string key);
    ~IncrLoop();
    void stop();
    std::uint64_t replies() const { return replies_; }
    const std::string& error() const { return error_; }
    double max_latency_ms() const { return max_latency_ms_; }

private:
    void loop();
    int fd_ = -1;
    std::string key_;
    std::atomic<bool> stop_{false};
    std::uint64_t replies_ = 0;
    std::string error_;
    double max_latency_ms_ = 0;
    std::thread thread_;
};

// The string after "key": (the first one).
std::string json_string(const std::string& json, const std::string& key);

// Lines of `path` that are JSON events of kind `event` (an `iprobe debug
// --json` session's stdout).
std::vector<std::string> events(const std::string& path, const std::string& event);

// Polls until `path` holds `count` events of kind `event`; false when the
// session (`debug`) exited first or the time ran out.
bool wait_for_event(const std::string& path, const std::string& event, size_t count, Child& debug,
                    std::chrono::seconds timeout = std::chrono::seconds(60));

size_t count_lines_with(const std::string& text, const std::string& needle);

// redis built with iprobe-cc (-finstrument-functions + coldpatch): built on
// first use by scripts/build-redis (idempotent, shared with other suites);
// "" when the build failed.
std::string finstrument_redis();

// Extracts "key":number from a flat JSON object; -1 when absent.
long long json_number(const std::string& json, const std::string& key);
// Extracts "key":"string" from a JSON line; "" when absent.
std::string json_string(const std::string& json, const std::string& key);
// The lines of the file at `path` that are JSON events of kind `event`
// ({"event":"EVENT",...}), as `iprobe debug --json` writes them.
std::vector<std::string> events(const std::string& path, const std::string& event);
std::string trim(std::string s);

}  // namespace iprobe::test
