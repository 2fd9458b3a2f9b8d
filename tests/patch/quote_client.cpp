#include "quote_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "../patch/targets/quote.h"

namespace iprobe::test {

namespace {

bool send_all(int fd, const std::string& data) {
    std::size_t at = 0;
    while (at < data.size()) {
        const ssize_t n = ::send(fd, data.data() + at, data.size() - at, MSG_NOSIGNAL);
        if (n <= 0) return false;
        at += static_cast<std::size_t>(n);
    }
    return true;
}

// Reads `count` integer replies (":N\r\n").
bool read_replies(int fd, std::size_t count, std::vector<long>& out, std::string& pending) {
    char buf[8192];
    while (out.size() < count) {
        std::size_t eol;
        while (out.size() < count && (eol = pending.find("\r\n")) != std::string::npos) {
            if (pending[0] != ':') return false;
            out.push_back(std::stol(pending.substr(1, eol - 1)));
            pending.erase(0, eol + 2);
        }
        if (out.size() == count) break;
        const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        if (n <= 0) return false;
        pending.append(buf, static_cast<std::size_t>(n));
    }
    return true;
}

}  // namespace

int connect_local(int port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<std::uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
        ::close(fd);
        return -1;
    }
    return fd;
}

std::vector<long> ask_quotes(int fd, const std::vector<long>& items) {
    std::string request;
    for (long item : items) request += "QUOTE " + std::to_string(item) + "\r\n";
    std::vector<long> out;
    std::string pending;
    if (!send_all(fd, request) || !read_replies(fd, items.size(), out, pending)) out.clear();
    return out;
}

QuoteLoad::QuoteLoad(int threads, std::function<int()> connect)
    : connect_(std::move(connect)), per_thread_(static_cast<std::size_t>(threads)) {
    for (int i = 0; i < threads; i++) threads_.emplace_back([this, i] { run(i); });
}

QuoteLoad::~QuoteLoad() { stop(); }

void QuoteLoad::stop() {
    stop_ = true;
    for (auto& t : threads_)
        if (t.joinable()) t.join();
}

QuoteCounts QuoteLoad::counts() const {
    QuoteCounts sum;
    for (const auto& c : per_thread_) {
        sum.replies += __atomic_load_n(&c.replies, __ATOMIC_RELAXED);
        sum.buggy_subset += __atomic_load_n(&c.buggy_subset, __ATOMIC_RELAXED);
        sum.old_answers += __atomic_load_n(&c.old_answers, __ATOMIC_RELAXED);
        sum.new_answers += __atomic_load_n(&c.new_answers, __ATOMIC_RELAXED);
        sum.wrong += __atomic_load_n(&c.wrong, __ATOMIC_RELAXED);
        sum.errors += __atomic_load_n(&c.errors, __ATOMIC_RELAXED);
    }
    return sum;
}

void QuoteLoad::run(int index) {
    QuoteCounts& c = per_thread_[static_cast<std::size_t>(index)];
    constexpr std::size_t kBatch = 32;
    long next = index * 1000003L;
    while (!stop_) {
        const int fd = connect_();
        if (fd < 0) {
            __atomic_add_fetch(&c.errors, 1, __ATOMIC_RELAXED);
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
            continue;
        }
        std::string pending;
        while (!stop_) {
            std::string request;
            std::vector<long> items;
            for (std::size_t i = 0; i < kBatch; i++, next++) {
                items.push_back(next % 100000);
                request += "QUOTE " + std::to_string(items.back()) + "\r\n";
            }
            std::vector<long> replies;
            if (!send_all(fd, request) || !read_replies(fd, items.size(), replies, pending)) {
                __atomic_add_fetch(&c.errors, 1, __ATOMIC_RELAXED);
                break;
            }
            for (std::size_t i = 0; i < items.size(); i++) {
                const long item = items[i], got = replies[i];
                const bool subset = QUOTE_BUGGY(item) != QUOTE_FIXED(item);
                __atomic_add_fetch(&c.replies, 1, __ATOMIC_RELAXED);
                if (subset) __atomic_add_fetch(&c.buggy_subset, 1, __ATOMIC_RELAXED);
                if (subset && got == QUOTE_BUGGY(item)) __atomic_add_fetch(&c.old_answers, 1, __ATOMIC_RELAXED);
                else if (subset && got == QUOTE_FIXED(item)) __atomic_add_fetch(&c.new_answers, 1, __ATOMIC_RELAXED);
                else if (!subset && got == QUOTE_FIXED(item)) continue;
                else __atomic_add_fetch(&c.wrong, 1, __ATOMIC_RELAXED);
            }
        }
        ::close(fd);
    }
}

}  // namespace iprobe::test
