// Load on patch_service (targets/patch_service.c): threads that keep asking
// for quotes over their own connections and sort every reply: the old
// (buggy) function's answer, the fix's, or neither (wrong).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace iprobe::test {

struct QuoteCounts {
    std::uint64_t replies = 0;
    std::uint64_t buggy_subset = 0;  // replies for items the bug affects
    std::uint64_t old_answers = 0;   // of those: the buggy function's price
    std::uint64_t new_answers = 0;   // of those: the fixed price
    std::uint64_t wrong = 0;         // a reply neither function gives
    std::uint64_t errors = 0;        // connections lost, replies missing
};

class QuoteLoad {
public:
    // `connect` returns a connected socket to the service (or -1).
    QuoteLoad(int threads, std::function<int()> connect);
    ~QuoteLoad();  // stops
    void stop();
    QuoteCounts counts() const;

private:
    void run(int index);
    std::function<int()> connect_;
    std::atomic<bool> stop_{false};
    std::vector<std::thread> threads_;
    std::vector<QuoteCounts> per_thread_;
};

// Quotes of `items`, one request each, on one connection: the replies as they came.
std::vector<long> ask_quotes(int fd, const std::vector<long>& items);

// A TCP connection to 127.0.0.1:port.
int connect_local(int port);

}  // namespace iprobe::test
