#include "iprobe/proxy/mirror.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdarg>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "iprobe/proxy/debug_buffer.h"
#include "iprobe/proxy/recording.h"
#include "iprobe/support/error.h"
#include "iprobe/support/json.h"
#include "stream_compare.h"

namespace iprobe::proxy {

namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kReadChunk = 64 * 1024;
constexpr std::size_t kMaxPendingMessages = 65536;  // per connection, for the divergence checker
constexpr std::size_t kMaxReports = 100;
constexpr std::size_t kMaxWindows = 1000;
constexpr int kDebugSendBuffer = 64 * 1024;  // the kernel doubles it
// The debug copy's leg is served in batches: bytes for it are sent, and its
// replies read, once per kDebugBatch (or as soon as kDebugFlushNow bytes wait),
// so duplicating a request costs a fraction of a syscall instead of two, and
// the debug side never wakes the production path.  The copy lags by at most
// this much, which no debugging session notices.
constexpr auto kDebugBatch = std::chrono::milliseconds(5);
constexpr std::size_t kDebugFlushNow = 32 * 1024;

double ms_since(Clock::time_point t) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// Log lines must never stall the event loop (and with it production) when
// whoever holds our stderr pipe stops reading it: write only what the fd takes
// now, drop the rest.
void write_stderr_now(std::string_view text) {
    while (!text.empty()) {
        pollfd p{STDERR_FILENO, POLLOUT, 0};
        if (::poll(&p, 1, 0) != 1 || !(p.revents & POLLOUT)) return;
        const ssize_t w = ::write(STDERR_FILENO, text.data(), std::min<std::size_t>(text.size(), 4096));
        if (w <= 0) return;
        text.remove_prefix(static_cast<std::size_t>(w));
    }
}

struct Handler {
    virtual void on_event(std::uint32_t events) = 0;
    virtual ~Handler() = default;
};

// An fd in the epoll set whose interest follows what its owner wants; an fd
// that wants nothing leaves the set, so a hung-up peer cannot spin the loop.
class Watched {
public:
    Watched() = default;
    Watched(int epfd, UniqueFd fd, Handler* h) : epfd_(epfd), fd_(std::move(fd)), handler_(h) {}
    int fd() const { return fd_.get(); }
    explicit operator bool() const { return static_cast<bool>(fd_); }
    void want(std::uint32_t events) {
        if (!fd_ || events == mask_) return;
        epoll_event ev{};
        ev.events = events;
        ev.data.ptr = handler_;
        if (events == 0) {
            ::epoll_ctl(epfd_, EPOLL_CTL_DEL, fd_.get(), nullptr);
        } else if (mask_ == 0) {
            ::epoll_ctl(epfd_, EPOLL_CTL_ADD, fd_.get(), &ev);
        } else {
            ::epoll_ctl(epfd_, EPOLL_CTL_MOD, fd_.get(), &ev);
        }
        mask_ = events;
    }
    void close() {
        want(0);
        fd_.reset();
    }

private:
    int epfd_ = -1;
    UniqueFd fd_;
    Handler* handler_ = nullptr;
    std::uint32_t mask_ = 0;
};

// Bytes one side could not take yet (kept small: the reader stops while any
// are pending, so production's own backpressure reaches the client).
struct Pending {
    std::string bytes;
    std::size_t offset = 0;
    bool empty() const { return offset == bytes.size(); }
    void add(const std::uint8_t* p, std::size_t n) {
        if (empty()) {
            bytes.clear();
            offset = 0;
        }
        bytes.append(reinterpret_cast<const char*>(p), n);
    }
};

enum class SendResult { done, again, failed };

// Sends as much as the socket takes now; never blocks.
SendResult send_some(int fd, const std::uint8_t* p, std::size_t n, std::size_t& sent) {
    sent = 0;
    while (sent < n) {
        const ssize_t w = ::send(fd, p + sent, n - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            sent += static_cast<std::size_t>(w);
            continue;
        }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return SendResult::again;
        return SendResult::failed;
    }
    return SendResult::done;
}

struct DivergenceReport {
    std::uint32_t connection;
    std::uint64_t index;  // message number in the connection (0-based) or byte offset (stream)
    std::string request;
    std::string production;
    std::string debug;
    double at_ms;
};

struct Stats {
    Clock::time_point started = Clock::now();
    std::uint64_t accepted = 0, active = 0, closed = 0;
    std::uint64_t production_connect_failures = 0, production_errors = 0;
    std::uint64_t bytes_client_to_production = 0, bytes_production_to_client = 0;
    std::uint64_t bytes_to_debug = 0, bytes_from_debug = 0;
    std::uint64_t debug_connections = 0, debug_connect_failures = 0, debug_errors = 0,
                  debug_closed_early = 0, debug_completed = 0, debug_linger_timeouts = 0;
    std::uint64_t lingering = 0;
    std::uint64_t overflows = 0;
    std::size_t buffered_now = 0, buffered_high_water = 0, connection_high_water = 0;
    std::uint64_t windows_count = 0;
    double windows_min = 0, windows_max = 0, windows_sum = 0;
    std::deque<double> windows_recent;
    std::uint64_t compared = 0, ignored = 0, mismatches = 0, diverged_connections = 0, unchecked_connections = 0;
    std::vector<DivergenceReport> reports;
    std::uint64_t aggregator_unclaimed = 0, aggregator_debug_unmatched = 0;

    void window(double ms) {
        windows_min = windows_count ? std::min(windows_min, ms) : ms;
        windows_max = std::max(windows_max, ms);
        windows_sum += ms;
        ++windows_count;
        windows_recent.push_back(ms);
        if (windows_recent.size() > kMaxWindows) windows_recent.pop_front();
    }
};

class Proxy;

// One client connection: client <-> production passthrough plus the debug leg
// fed from a bounded buffer.  In aggregator mode "client" is production's
// outbound connection and "production" the real backend.
class Connection {
public:
    enum class Side { client, production, debug };
    enum class DebugState { none, connecting, open, done };

    Connection(Proxy& px, std::uint32_t id, UniqueFd client);
    ~Connection();

    void on_event(Side side, std::uint32_t events);
    void start(std::optional<std::uint64_t> aggregator_slot);
    bool finished() const { return pair_closed_ && debug_state_ != DebugState::connecting && debug_state_ != DebugState::open; }
    bool lingering() const { return pair_closed_ && !finished(); }
    Clock::time_point linger_deadline() const { return linger_deadline_; }
    void linger_timeout();
    void abort_all();
    std::uint32_t id() const { return id_; }
    std::size_t debug_buffered() const { return dbuf_.size(); }
    void describe(JsonWriter& j) const;
    // Called by the proxy's debug pass for connections queued with
    // Proxy::queue_debug_flush().
    void flush_debug_batch();
    bool in_debug_queue = false;

private:
    struct Leg final : Handler {
        Connection* owner;
        Side side;
        Watched w;
        void on_event(std::uint32_t events) override { owner->on_event(side, events); }
    };

    void read_client();
    void read_production();
    void read_debug();
    void flush_production();
    void flush_client();
    void flush_debug();
    void production_connected();
    void mirror_to_debug(const std::uint8_t* p, std::size_t n);
    void overflow();
    void close_debug(const char* why, bool copy_finished = false);
    void finish_checking();
    void close_pair();
    void update();
    void settle();
    void maybe_finish_pair();
    void check_requests(const std::uint8_t* p, std::size_t n);
    void check_replies(int side, const std::uint8_t* p, std::size_t n);
    void compare_messages();
    void report(std::uint64_t index, const std::string& request, const std::string& prod, const std::string& dbg);
    void stop_checking(const std::string& why);

    Proxy& px_;
    std::uint32_t id_;
    Clock::time_point start_ = Clock::now();
    Leg client_, prod_, debug_;
    Pending to_prod_, to_client_;
    bool prod_connecting_ = true;
    bool client_eof_ = false, prod_eof_ = false;
    bool prod_shut_ = false, client_shut_ = false, debug_shut_ = false;
    bool pair_closed_ = false;
    DebugState debug_state_ = DebugState::none;
    DebugBuffer dbuf_;
    bool debug_backlogged_ = false;  // the debug socket refused bytes: wait for EPOLLOUT
    bool overflowed_ = false;
    Clock::time_point linger_deadline_{};
    std::optional<std::uint64_t> slot_;

    // divergence checking
    bool checking_ = false;
    bool reported_ = false;
    std::unique_ptr<Framer> request_framer_, reply_framer_[2];
    std::deque<Message> requests_, replies_[2];
    std::vector<Message> scratch_;
    std::uint64_t compared_index_ = 0;
    std::unique_ptr<StreamComparer> stream_;
};

// Aggregator: production's replies for its N-th outbound connection, waiting
// for (or being fed to) the debug copy's N-th outbound connection.
struct Slot final : Handler {
    Proxy* px = nullptr;
    std::uint64_t ordinal = 0;
    std::uint32_t production_id = 0;
    bool production_seen = false, production_done = false;
    Clock::time_point production_start{};
    DebugBuffer replies{0};
    bool overflowed = false;
    Watched debug;  // the debug copy's connection
    bool debug_seen = false, debug_done = false, debug_shut = false;
    Clock::time_point deadline{};
    std::unique_ptr<StreamComparer> requests;  // production's vs the debug copy's outbound requests
    bool reported = false;
    void on_event(std::uint32_t events) override;
    void flush();
    void close_debug();
    void add_reply(const std::uint8_t* p, std::size_t n);
    void production_request(const std::uint8_t* p, std::size_t n);
};

struct Acceptor final : Handler {
    Proxy* px;
    enum class Kind { clients, debug_clients, stats } kind;
    Watched w;
    void on_event(std::uint32_t events) override;
};

struct StatsClient final : Handler {
    Proxy* px;
    Watched w;
    std::string request;
    Pending out;
    bool responding = false;
    bool done = false;
    void on_event(std::uint32_t events) override;
};

struct SignalHandler final : Handler {
    Proxy* px;
    Watched w;
    void on_event(std::uint32_t events) override;
};

class Proxy {
public:
    Proxy(const MirrorOptions& options);
    ~Proxy();
    MirrorReady ready() const;
    void run();

    const MirrorOptions& opt;
    int epfd = -1;
    int debug_epfd = -1;  // debug legs of duplicated connections, polled once per kDebugBatch
    Stats stats;
    std::unique_ptr<Recorder> recorder;
    std::uint8_t scratch[kReadChunk];
    bool stopping = false;

    void accept_clients(Acceptor& a);
    void accept_debug_client(Acceptor& a);
    void accept_stats(Acceptor& a);
    void retire(Connection* c) { retired_.insert(c); }
    void queue_debug_flush(Connection* c) {
        if (c->in_debug_queue) return;
        c->in_debug_queue = true;
        debug_queue_.push_back(c);
    }
    void retire(StatsClient* s) { retired_stats_.insert(s); }
    void log(const char* fmt, ...) __attribute__((format(printf, 2, 3)));
    std::uint64_t now_ns() const {
        return static_cast<std::uint64_t>(
            std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - stats.started).count());
    }
    std::string stats_json(bool pretty_connections) const;
    void note_buffered(std::ptrdiff_t delta) {
        stats.buffered_now = static_cast<std::size_t>(static_cast<std::ptrdiff_t>(stats.buffered_now) + delta);
        stats.buffered_high_water = std::max(stats.buffered_high_water, stats.buffered_now);
    }
    bool total_budget_allows(std::size_t n) const { return stats.buffered_now + n <= opt.buffer_total; }
    Slot& slot(std::uint64_t ordinal);
    void maybe_drop_slot(std::uint64_t ordinal);
    void on_signal(int sig);
    void rate_limited_log(std::uint64_t count, const char* fmt, ...) __attribute__((format(printf, 3, 4)));

private:
    void tick();
    void reap();
    void debug_pass();
    int wait_timeout_ms() const;

    UniqueFd ep_, debug_ep_;
    std::vector<Connection*> debug_queue_;  // bytes waiting for the next debug pass
    Clock::time_point last_debug_pass_{};
    Acceptor clients_, debug_clients_, stats_listener_;
    SignalHandler signals_;
    std::map<std::uint32_t, std::unique_ptr<Connection>> connections_;
    std::set<Connection*> retired_;
    std::set<StatsClient*> retired_stats_;
    std::set<std::unique_ptr<StatsClient>> stats_clients_;
    std::map<std::uint64_t, std::unique_ptr<Slot>> slots_;
    std::vector<std::unique_ptr<Slot>> retired_slots_;
    std::uint64_t next_production_ordinal_ = 0, next_debug_ordinal_ = 0;
    std::uint32_t next_id_ = 1;
    bool accept_paused_ = false;
    Clock::time_point last_tick_{};
};

// ---------------------------------------------------------------- Connection

Connection::Connection(Proxy& px, std::uint32_t id, UniqueFd client)
    : px_(px), id_(id), dbuf_(px.opt.buffer) {
    client_.owner = prod_.owner = debug_.owner = this;
    client_.side = Side::client;
    prod_.side = Side::production;
    debug_.side = Side::debug;
    client_.w = Watched(px.epfd, std::move(client), &client_);
}

Connection::~Connection() { abort_all(); }

void Connection::start(std::optional<std::uint64_t> aggregator_slot) {
    slot_ = aggregator_slot;
    const int one = 1;
    ::setsockopt(client_.w.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (px_.recorder) px_.recorder->add(RecordKind::open, id_, px_.now_ns());
    const Endpoint& target = px_.opt.upstream ? *px_.opt.upstream : *px_.opt.production;
    UniqueFd p = start_connect(target);
    if (!p) {
        ++px_.stats.production_connect_failures;
        px_.rate_limited_log(px_.stats.production_connect_failures, "connection %u: cannot connect to %s: %s",
                             id_, target.str().c_str(), std::strerror(errno));
        close_pair();
        return;
    }
    prod_.w = Watched(px_.epfd, std::move(p), &prod_);
    if (slot_) {
        Slot& s = px_.slot(*slot_);
        s.production_seen = true;
        s.production_id = id_;
        s.production_start = start_;
    }
    if (px_.opt.debug) {
        UniqueFd d = start_connect(*px_.opt.debug);
        if (!d) {
            ++px_.stats.debug_connect_failures;
            px_.rate_limited_log(px_.stats.debug_connect_failures, "connection %u: debug copy %s unreachable: %s",
                                 id_, px_.opt.debug->str().c_str(), std::strerror(errno));
        } else {
            // A fixed, small kernel send buffer: left to autotuning it grows to
            // megabytes and would hide a stalled debug copy from --buffer.
            const int sndbuf = kDebugSendBuffer;
            ::setsockopt(d.get(), SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
            debug_.w = Watched(px_.debug_epfd, std::move(d), &debug_);
            debug_state_ = DebugState::connecting;
            if (px_.opt.divergence == Protocol::stream) {
                stream_ = std::make_unique<StreamComparer>(px_.opt.buffer);
                checking_ = true;
            } else if (px_.opt.divergence != Protocol::off) {
                request_framer_ = Framer::create(px_.opt.divergence, Role::request, px_.opt.rules);
                reply_framer_[0] = Framer::create(px_.opt.divergence, Role::response, px_.opt.rules);
                reply_framer_[1] = Framer::create(px_.opt.divergence, Role::response, px_.opt.rules);
                checking_ = true;
            }
        }
    }
    update();
}

void Connection::on_event(Side side, std::uint32_t events) {
    if (pair_closed_ && side != Side::debug) return;
    switch (side) {
    case Side::client:
        if (events & EPOLLOUT) flush_client();
        if (!pair_closed_ && (events & (EPOLLIN | EPOLLHUP | EPOLLERR))) read_client();
        break;
    case Side::production:
        if (prod_connecting_) {
            int err = 0;
            socklen_t len = sizeof err;
            ::getsockopt(prod_.w.fd(), SOL_SOCKET, SO_ERROR, &err, &len);
            if (err != 0) {
                ++px_.stats.production_connect_failures;
                const Endpoint& target = px_.opt.upstream ? *px_.opt.upstream : *px_.opt.production;
                px_.rate_limited_log(px_.stats.production_connect_failures,
                                     "connection %u: cannot connect to production %s: %s; closing the client",
                                     id_, target.str().c_str(), std::strerror(err));
                close_pair();
                break;
            }
            if (!(events & EPOLLOUT)) break;
            production_connected();
            break;
        }
        if (events & EPOLLOUT) flush_production();
        if (!pair_closed_ && (events & (EPOLLIN | EPOLLHUP | EPOLLERR))) read_production();
        break;
    case Side::debug:
        if (debug_state_ == DebugState::connecting) {
            int err = 0;
            socklen_t len = sizeof err;
            ::getsockopt(debug_.w.fd(), SOL_SOCKET, SO_ERROR, &err, &len);
            if (err != 0) {
                ++px_.stats.debug_connect_failures;
                px_.rate_limited_log(px_.stats.debug_connect_failures,
                                     "connection %u: cannot connect to debug copy %s: %s (production unaffected)",
                                     id_, px_.opt.debug->str().c_str(), std::strerror(err));
                close_debug(nullptr);
                break;
            }
            if (!(events & EPOLLOUT)) break;
            debug_state_ = DebugState::open;
            ++px_.stats.debug_connections;
            const int one = 1;
            ::setsockopt(debug_.w.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        }
        if (debug_state_ == DebugState::open && (events & EPOLLOUT)) {
            debug_backlogged_ = false;
            flush_debug();
        }
        if (debug_state_ == DebugState::open && (events & (EPOLLIN | EPOLLHUP | EPOLLERR))) read_debug();
        break;
    }
    settle();
}

void Connection::production_connected() {
    prod_connecting_ = false;
    const int one = 1;
    ::setsockopt(prod_.w.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    flush_production();
}

void Connection::read_client() {
    const ssize_t n = ::recv(client_.w.fd(), px_.scratch, sizeof px_.scratch, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n <= 0) {
        if (n < 0) {  // reset: nothing more will come; production gets what arrived
            close_pair();
            return;
        }
        client_eof_ = true;
        if (px_.recorder) px_.recorder->add(RecordKind::close, id_, px_.now_ns());
        if (to_prod_.empty() && !prod_connecting_ && !prod_shut_) {
            ::shutdown(prod_.w.fd(), SHUT_WR);
            prod_shut_ = true;
        }
        if (debug_state_ == DebugState::open && dbuf_.empty() && !debug_shut_) {
            ::shutdown(debug_.w.fd(), SHUT_WR);
            debug_shut_ = true;
        }
        maybe_finish_pair();
        return;
    }
    const auto* p = px_.scratch;
    const auto size = static_cast<std::size_t>(n);
    px_.stats.bytes_client_to_production += size;
    if (px_.recorder) px_.recorder->add(RecordKind::data, id_, px_.now_ns(), p, size);
    if (checking_) check_requests(p, size);
    if (slot_) px_.slot(*slot_).production_request(p, size);
    mirror_to_debug(p, size);
    if (prod_connecting_ || !to_prod_.empty()) {
        to_prod_.add(p, size);
        return;
    }
    std::size_t sent = 0;
    const SendResult r = send_some(prod_.w.fd(), p, size, sent);
    if (r == SendResult::failed) {
        ++px_.stats.production_errors;
        close_pair();
        return;
    }
    if (sent < size) to_prod_.add(p + sent, size - sent);
}

void Connection::flush_production() {
    if (!to_prod_.empty()) {
        std::size_t sent = 0;
        const SendResult r = send_some(prod_.w.fd(), reinterpret_cast<const std::uint8_t*>(to_prod_.bytes.data()) + to_prod_.offset,
                                       to_prod_.bytes.size() - to_prod_.offset, sent);
        to_prod_.offset += sent;
        if (r == SendResult::failed) {
            ++px_.stats.production_errors;
            close_pair();
            return;
        }
    }
    if (to_prod_.empty() && client_eof_ && !prod_shut_) {
        ::shutdown(prod_.w.fd(), SHUT_WR);
        prod_shut_ = true;
    }
    maybe_finish_pair();
}

void Connection::read_production() {
    const ssize_t n = ::recv(prod_.w.fd(), px_.scratch, sizeof px_.scratch, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n <= 0) {
        prod_eof_ = true;
        if (n < 0) ++px_.stats.production_errors;
        if (checking_ && reply_framer_[0]) {
            scratch_.clear();
            reply_framer_[0]->finish(scratch_);
            for (auto& m : scratch_) replies_[0].push_back(std::move(m));
            compare_messages();
        }
        if (to_client_.empty() && !client_shut_) {
            ::shutdown(client_.w.fd(), SHUT_WR);
            client_shut_ = true;
        }
        if (n < 0) close_pair(); else maybe_finish_pair();
        return;
    }
    const auto* p = px_.scratch;
    const auto size = static_cast<std::size_t>(n);
    px_.stats.bytes_production_to_client += size;
    if (slot_) px_.slot(*slot_).add_reply(p, size);
    if (checking_) check_replies(0, p, size);
    if (!to_client_.empty()) {
        to_client_.add(p, size);
        return;
    }
    std::size_t sent = 0;
    if (send_some(client_.w.fd(), p, size, sent) == SendResult::failed) {
        close_pair();
        return;
    }
    if (sent < size) to_client_.add(p + sent, size - sent);
}

void Connection::flush_client() {
    if (!to_client_.empty()) {
        std::size_t sent = 0;
        const SendResult r = send_some(client_.w.fd(), reinterpret_cast<const std::uint8_t*>(to_client_.bytes.data()) + to_client_.offset,
                                       to_client_.bytes.size() - to_client_.offset, sent);
        to_client_.offset += sent;
        if (r == SendResult::failed) {
            close_pair();
            return;
        }
    }
    if (to_client_.empty() && prod_eof_ && !client_shut_) {
        ::shutdown(client_.w.fd(), SHUT_WR);
        client_shut_ = true;
    }
    maybe_finish_pair();
}

void Connection::maybe_finish_pair() {
    if (!pair_closed_ && client_eof_ && prod_eof_ && to_prod_.empty() && to_client_.empty()) close_pair();
}

void Connection::mirror_to_debug(const std::uint8_t* p, std::size_t n) {
    if (debug_state_ != DebugState::connecting && debug_state_ != DebugState::open) return;
    if (!px_.total_budget_allows(n) || !dbuf_.append(p, n)) {
        overflow();
        return;
    }
    px_.note_buffered(static_cast<std::ptrdiff_t>(n));
    px_.stats.connection_high_water = std::max(px_.stats.connection_high_water, dbuf_.size());
    if (debug_state_ != DebugState::open || debug_backlogged_) return;
    if (dbuf_.size() >= std::min(kDebugFlushNow, dbuf_.capacity() / 4))
        flush_debug();
    else
        px_.queue_debug_flush(this);
}

void Connection::flush_debug_batch() {
    in_debug_queue = false;
    if (debug_state_ != DebugState::open || debug_backlogged_) return;
    flush_debug();
    settle();
}

void Connection::overflow() {
    overflowed_ = true;
    const double window = ms_since(start_);
    ++px_.stats.overflows;
    px_.stats.window(window);
    px_.rate_limited_log(px_.stats.overflows,
                         "connection %u: debug buffer full (%zu bytes) after %.1f ms: debug side closed, "
                         "connection marked diverged (production unaffected)",
                         id_, dbuf_.size(), window);
    close_debug(nullptr);
}

void Connection::flush_debug() {
    while (!dbuf_.empty()) {
        const auto front = dbuf_.front();
        std::size_t sent = 0;
        const SendResult r = send_some(debug_.w.fd(), front.data(), front.size(), sent);
        dbuf_.consume(sent);
        px_.note_buffered(-static_cast<std::ptrdiff_t>(sent));
        px_.stats.bytes_to_debug += sent;
        if (r == SendResult::failed) {
            ++px_.stats.debug_errors;
            close_debug("write to debug copy failed");
            return;
        }
        if (r == SendResult::again) {
            debug_backlogged_ = true;
            return;
        }
    }
    if ((client_eof_ || pair_closed_) && !debug_shut_) {
        ::shutdown(debug_.w.fd(), SHUT_WR);
        debug_shut_ = true;
    }
}

void Connection::read_debug() {
    const ssize_t n = ::recv(debug_.w.fd(), px_.scratch, sizeof px_.scratch, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n <= 0) {
        if (n < 0) {
            ++px_.stats.debug_errors;
            close_debug("debug copy connection failed");
            return;
        }
        if (checking_ && reply_framer_[1]) {
            scratch_.clear();
            reply_framer_[1]->finish(scratch_);
            for (auto& m : scratch_) replies_[1].push_back(std::move(m));
            compare_messages();
        }
        // Servers that close after answering (HTTP/1.0) end here too: the
        // replies they sent are still compared as production's arrive.
        if (debug_shut_ && dbuf_.empty()) ++px_.stats.debug_completed; else ++px_.stats.debug_closed_early;
        close_debug(nullptr, true);
        return;
    }
    px_.stats.bytes_from_debug += static_cast<std::size_t>(n);
    if (checking_) check_replies(1, px_.scratch, static_cast<std::size_t>(n));
}

void Connection::close_debug(const char* why, bool copy_finished) {
    if (debug_state_ == DebugState::none || debug_state_ == DebugState::done) return;
    if (why) px_.rate_limited_log(px_.stats.debug_errors, "connection %u: %s (production unaffected)", id_, why);
    debug_.w.close();
    debug_state_ = DebugState::done;
    px_.note_buffered(-static_cast<std::ptrdiff_t>(dbuf_.size()));
    dbuf_.clear();
    // A copy cut off by us (overflow, error) is behind, not different: stop
    // comparing.  One that closed by itself said all it had to say.
    if (!copy_finished) stop_checking("");
    if (pair_closed_) {
        --px_.stats.lingering;
        finish_checking();
    }
}

// Both streams have ended: any reply production sent that the debug copy
// never did (or the reverse) is a divergence.
void Connection::finish_checking() {
    if (!checking_) return;
    if (!reported_) {
        if (stream_ && stream_->unmatched(0) != stream_->unmatched(1)) {
            report(stream_->matched(), "", stream_->unmatched(0) ? "(more bytes)" : "(end of stream)",
                   stream_->unmatched(1) ? "(more bytes)" : "(end of stream)");
        } else if (!stream_ && replies_[0].size() != replies_[1].size()) {
            report(compared_index_, requests_.empty() ? std::string() : requests_.front().summary,
                   replies_[0].empty() ? "(no reply)" : replies_[0].front().excerpt,
                   replies_[1].empty() ? "(no reply)" : replies_[1].front().excerpt);
        }
    }
    stop_checking("");
}

void Connection::close_pair() {
    if (pair_closed_) return;
    pair_closed_ = true;
    if (px_.recorder && !client_eof_) px_.recorder->add(RecordKind::close, id_, px_.now_ns());
    client_eof_ = true;
    client_.w.close();
    prod_.w.close();
    --px_.stats.active;
    ++px_.stats.closed;
    if (slot_) {
        Slot& s = px_.slot(*slot_);
        s.production_done = true;
        s.deadline = Clock::now() + std::chrono::milliseconds(static_cast<long>(px_.opt.debug_linger_s * 1000));
        s.flush();
        px_.maybe_drop_slot(*slot_);
    }
    if (debug_state_ == DebugState::connecting || debug_state_ == DebugState::open) {
        ++px_.stats.lingering;
        linger_deadline_ = Clock::now() + std::chrono::milliseconds(static_cast<long>(px_.opt.debug_linger_s * 1000));
        if (debug_state_ == DebugState::open) flush_debug();
    } else {
        finish_checking();
    }
}

void Connection::linger_timeout() {
    ++px_.stats.debug_linger_timeouts;
    px_.rate_limited_log(px_.stats.debug_linger_timeouts, "connection %u: debug copy did not finish within %.0f s after the client left; %zu bytes undelivered",
            id_, px_.opt.debug_linger_s, dbuf_.size());
    close_debug(nullptr);
    px_.retire(this);
}

void Connection::abort_all() {
    if (!pair_closed_) close_pair();
    if (debug_state_ == DebugState::connecting || debug_state_ == DebugState::open) close_debug(nullptr);
}

// After any I/O: watch what is still wanted, or hand a finished connection
// to the proxy for removal.
void Connection::settle() {
    if (!finished()) update();
    if (finished()) px_.retire(this);
}

void Connection::update() {
    if (!pair_closed_) {
        std::uint32_t c = 0, p = 0;
        if (!client_eof_ && to_prod_.empty()) c |= EPOLLIN;
        if (!to_client_.empty()) c |= EPOLLOUT;
        if (prod_connecting_ || !to_prod_.empty()) p |= EPOLLOUT;
        if (!prod_connecting_ && !prod_eof_ && to_client_.empty()) p |= EPOLLIN;
        client_.w.want(c);
        prod_.w.want(p);
    }
    if (debug_state_ == DebugState::connecting) {
        debug_.w.want(EPOLLOUT);
    } else if (debug_state_ == DebugState::open) {
        debug_.w.want(EPOLLIN | (debug_backlogged_ ? static_cast<std::uint32_t>(EPOLLOUT) : 0u));
    }
}

// --- divergence

void Connection::check_requests(const std::uint8_t* p, std::size_t n) {
    if (!request_framer_) return;
    scratch_.clear();
    request_framer_->feed({p, n}, scratch_);
    if (request_framer_->failed()) return stop_checking("requests: " + request_framer_->error());
    for (auto& m : scratch_) {
        reply_framer_[0]->expect(m);
        reply_framer_[1]->expect(m);
        requests_.push_back(std::move(m));
    }
    if (requests_.size() > kMaxPendingMessages) stop_checking("too many requests awaiting comparison");
}

void Connection::check_replies(int side, const std::uint8_t* p, std::size_t n) {
    if (stream_) {
        const auto r = stream_->feed(side, {p, n});
        if (r == StreamComparer::Result::mismatch) {
            report(stream_->mismatch_offset(), "", stream_->reference_excerpt(), stream_->copy_excerpt());
            stop_checking("");
        } else if (r == StreamComparer::Result::too_far_apart) {
            stop_checking("debug replies too far behind production's to compare");
        }
        return;
    }
    scratch_.clear();
    reply_framer_[side]->feed({p, n}, scratch_);
    if (reply_framer_[side]->failed())
        return stop_checking(std::string(side == 0 ? "production" : "debug") + " replies: " + reply_framer_[side]->error());
    for (auto& m : scratch_) replies_[side].push_back(std::move(m));
    compare_messages();
    if (replies_[side].size() > kMaxPendingMessages) stop_checking("too many replies awaiting comparison");
}

void Connection::compare_messages() {
    while (checking_ && !replies_[0].empty() && !replies_[1].empty()) {
        Message prod = std::move(replies_[0].front());
        Message dbg = std::move(replies_[1].front());
        replies_[0].pop_front();
        replies_[1].pop_front();
        Message req;
        if (!requests_.empty()) {
            req = std::move(requests_.front());
            requests_.pop_front();
        }
        const std::uint64_t index = compared_index_++;
        if (!req.verb.empty() && px_.opt.rules.ignores_command(req.verb)) {
            ++px_.stats.ignored;
            continue;
        }
        ++px_.stats.compared;
        if (prod.hash != dbg.hash) report(index, req.summary, prod.excerpt, dbg.excerpt);
    }
}

void Connection::report(std::uint64_t index, const std::string& request, const std::string& prod, const std::string& dbg) {
    ++px_.stats.mismatches;
    if (reported_) return;
    reported_ = true;
    ++px_.stats.diverged_connections;
    const char* unit = stream_ ? "byte offset" : "reply";
    px_.rate_limited_log(px_.stats.diverged_connections, "divergence on connection %u, %s %llu%s%s%s: production \"%s\", debug copy \"%s\"", id_, unit,
            static_cast<unsigned long long>(index), request.empty() ? "" : " to '", printable(request).c_str(),
            request.empty() ? "" : "'", printable(prod, 80).c_str(), printable(dbg, 80).c_str());
    if (px_.stats.reports.size() < kMaxReports)
        px_.stats.reports.push_back({id_, index, request, prod, dbg, ms_since(px_.stats.started)});
}

void Connection::stop_checking(const std::string& why) {
    if (!checking_) return;
    checking_ = false;
    if (!why.empty()) {
        ++px_.stats.unchecked_connections;
        px_.rate_limited_log(px_.stats.unchecked_connections, "connection %u: divergence checking stopped: %s", id_,
                             why.c_str());
    }
    requests_.clear();
    replies_[0].clear();
    replies_[1].clear();
    stream_.reset();
}

void Connection::describe(JsonWriter& j) const {
    j.begin_object();
    j.field("id", id_);
    j.field("age_ms", ms_since(start_));
    j.field("lingering", pair_closed_);
    j.field("debug", debug_state_ == DebugState::open ? "open" : debug_state_ == DebugState::connecting ? "connecting" : overflowed_ ? "overflowed" : "none");
    j.field("debug_buffered", static_cast<std::uint64_t>(dbuf_.size()));
    j.field("debug_buffer_high_water", static_cast<std::uint64_t>(dbuf_.high_water()));
    j.end_object();
}

// ---------------------------------------------------------------- Slot (aggregator)

void Slot::add_reply(const std::uint8_t* p, std::size_t n) {
    if (overflowed || debug_done) return;
    if (!px->total_budget_allows(n) || !replies.append(p, n)) {
        overflowed = true;
        const double window = ms_since(production_start);
        ++px->stats.overflows;
        px->stats.window(window);
        px->rate_limited_log(px->stats.overflows,
                             "upstream connection %llu: reply buffer full after %.1f ms; the debug copy's "
                             "connection is closed", static_cast<unsigned long long>(ordinal), window);
        px->note_buffered(-static_cast<std::ptrdiff_t>(replies.size()));
        replies.clear();
        close_debug();
        return;
    }
    px->note_buffered(static_cast<std::ptrdiff_t>(n));
    px->stats.connection_high_water = std::max(px->stats.connection_high_water, replies.size());
    flush();
}

void Slot::production_request(const std::uint8_t* p, std::size_t n) {
    if (requests && !reported) {
        const auto r = requests->feed(0, {p, n});
        if (r == StreamComparer::Result::too_far_apart) requests.reset();
        if (r == StreamComparer::Result::mismatch) {
            reported = true;
            ++px->stats.mismatches;
            ++px->stats.diverged_connections;
            px->rate_limited_log(px->stats.diverged_connections,
                    "divergence: the debug copy's upstream connection %llu sent different requests at byte %llu: "
                    "production \"%s\", debug copy \"%s\"", static_cast<unsigned long long>(ordinal),
                    static_cast<unsigned long long>(requests->mismatch_offset()),
                    printable(requests->reference_excerpt(), 80).c_str(), printable(requests->copy_excerpt(), 80).c_str());
            if (px->stats.reports.size() < kMaxReports)
                px->stats.reports.push_back({production_id, requests->mismatch_offset(), "(upstream request stream)",
                                             requests->reference_excerpt(), requests->copy_excerpt(),
                                             ms_since(px->stats.started)});
        }
    }
}

void Slot::flush() {
    if (!debug || debug_done) return;
    while (!replies.empty()) {
        const auto front = replies.front();
        std::size_t sent = 0;
        const SendResult r = send_some(debug.fd(), front.data(), front.size(), sent);
        replies.consume(sent);
        px->note_buffered(-static_cast<std::ptrdiff_t>(sent));
        px->stats.bytes_to_debug += sent;
        if (r == SendResult::failed) {
            ++px->stats.debug_errors;
            close_debug();
            return;
        }
        if (r == SendResult::again) break;
    }
    if (replies.empty() && production_done && !debug_shut) {
        ::shutdown(debug.fd(), SHUT_WR);
        debug_shut = true;
    }
    if (!debug_done) debug.want(EPOLLIN | (replies.empty() ? 0u : static_cast<std::uint32_t>(EPOLLOUT)));
}

void Slot::on_event(std::uint32_t events) {
    if (events & EPOLLOUT) flush();
    if (!debug_done && (events & (EPOLLIN | EPOLLHUP | EPOLLERR))) {
        const ssize_t n = ::recv(debug.fd(), px->scratch, sizeof px->scratch, MSG_DONTWAIT);
        if (n > 0) {
            px->stats.bytes_from_debug += static_cast<std::size_t>(n);
            if (requests && !reported) {
                const auto r = requests->feed(1, {px->scratch, static_cast<std::size_t>(n)});
                if (r == StreamComparer::Result::too_far_apart) requests.reset();
                if (r == StreamComparer::Result::mismatch) {
                    reported = true;
                    ++px->stats.mismatches;
                    ++px->stats.diverged_connections;
                    px->rate_limited_log(px->stats.diverged_connections,
                            "divergence: the debug copy's upstream connection %llu sent different requests at byte %llu",
                            static_cast<unsigned long long>(ordinal), static_cast<unsigned long long>(requests->mismatch_offset()));
                    if (px->stats.reports.size() < kMaxReports)
                        px->stats.reports.push_back({production_id, requests->mismatch_offset(), "(upstream request stream)",
                                                     requests->reference_excerpt(), requests->copy_excerpt(),
                                                     ms_since(px->stats.started)});
                }
            }
        } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
            if (n == 0) ++px->stats.debug_completed; else ++px->stats.debug_errors;
            close_debug();
        }
    }
    px->maybe_drop_slot(ordinal);
}

void Slot::close_debug() {
    if (debug_done) return;
    debug_done = true;
    debug.close();
    px->note_buffered(-static_cast<std::ptrdiff_t>(replies.size()));
    replies.clear();
}

// ---------------------------------------------------------------- Proxy

Proxy::Proxy(const MirrorOptions& options) : opt(options) {
    ep_.reset(::epoll_create1(EPOLL_CLOEXEC));
    debug_ep_.reset(::epoll_create1(EPOLL_CLOEXEC));
    if (!ep_ || !debug_ep_) throw_errno("epoll_create1");
    epfd = ep_.get();
    debug_epfd = debug_ep_.get();

    rlimit lim{};
    if (::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
        lim.rlim_cur = lim.rlim_max;
        ::setrlimit(RLIMIT_NOFILE, &lim);
    }

    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGUSR1);
    ::sigprocmask(SIG_BLOCK, &mask, nullptr);
    ::signal(SIGPIPE, SIG_IGN);
    signals_.px = this;
    signals_.w = Watched(epfd, UniqueFd(::signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC)), &signals_);
    signals_.w.want(EPOLLIN);

    clients_.px = this;
    clients_.kind = Acceptor::Kind::clients;
    clients_.w = Watched(epfd, listen_on(opt.listen, "--listen"), &clients_);
    if (opt.debug_listen) {
        debug_clients_.px = this;
        debug_clients_.kind = Acceptor::Kind::debug_clients;
        debug_clients_.w = Watched(epfd, listen_on(*opt.debug_listen, "--debug-listen"), &debug_clients_);
    }
    if (opt.stats) {
        stats_listener_.px = this;
        stats_listener_.kind = Acceptor::Kind::stats;
        stats_listener_.w = Watched(epfd, listen_on(*opt.stats, "--stats"), &stats_listener_);
    }
    if (!opt.record_path.empty()) recorder = std::make_unique<Recorder>(opt.record_path, 256u << 20);
    clients_.w.want(EPOLLIN);
    if (debug_clients_.w) debug_clients_.w.want(EPOLLIN);
    if (stats_listener_.w) stats_listener_.w.want(EPOLLIN);
}

Proxy::~Proxy() {
    connections_.clear();
    slots_.clear();
    stats_clients_.clear();
    if (recorder) recorder->finish();
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGUSR1);
    ::sigprocmask(SIG_UNBLOCK, &mask, nullptr);
}

MirrorReady Proxy::ready() const {
    MirrorReady r;
    r.listen = local_endpoint(clients_.w.fd());
    if (debug_clients_.w) r.debug_listen = local_endpoint(debug_clients_.w.fd());
    if (stats_listener_.w) r.stats = local_endpoint(stats_listener_.w.fd());
    return r;
}

void Proxy::log(const char* fmt, ...) {
    if (opt.quiet) return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    write_stderr_now(std::string("iprobe mirror: ") + line + "\n");
}

void Proxy::rate_limited_log(std::uint64_t count, const char* fmt, ...) {
    if (opt.quiet) return;
    if (count > 10 && count % 1000 != 0) return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    write_stderr_now(std::string("iprobe mirror: ") + line +
                     (count == 10 ? " (further messages like this one: every 1000th)" : "") + "\n");
}

void Proxy::run() {
    epoll_event events[256];
    while (!stopping) {
        const int n = ::epoll_wait(epfd, events, 256, wait_timeout_ms());
        if (n < 0 && errno != EINTR) throw_errno("epoll_wait");
        for (int i = 0; i < n; ++i) {
            static_cast<Handler*>(events[i].data.ptr)->on_event(events[i].events);
        }
        if (Clock::now() - last_debug_pass_ >= kDebugBatch) debug_pass();
        reap();
        tick();
    }
    debug_pass();  // what was queued for the debug copy still goes out
}

// While debug legs exist the loop wakes at least once per batch for them.
int Proxy::wait_timeout_ms() const {
    if (!opt.debug || connections_.empty()) return 200;
    const auto due = last_debug_pass_ + kDebugBatch - Clock::now();
    return static_cast<int>(std::clamp<long>(
        std::chrono::ceil<std::chrono::milliseconds>(due).count(), 0, kDebugBatch.count()));
}

void Proxy::debug_pass() {
    last_debug_pass_ = Clock::now();
    std::vector<Connection*> queued;
    queued.swap(debug_queue_);
    for (Connection* c : queued) c->flush_debug_batch();
    epoll_event events[256];
    for (int round = 0; round < 64; ++round) {
        const int n = ::epoll_wait(debug_epfd, events, 256, 0);
        for (int i = 0; i < n; ++i) static_cast<Handler*>(events[i].data.ptr)->on_event(events[i].events);
        if (n < 256) break;
    }
}

void Proxy::reap() {
    if (!retired_.empty())
        std::erase_if(debug_queue_, [&](Connection* c) { return retired_.count(c) != 0; });
    for (Connection* c : retired_) connections_.erase(c->id());
    retired_.clear();
    for (StatsClient* s : retired_stats_) {
        for (auto it = stats_clients_.begin(); it != stats_clients_.end(); ++it) {
            if (it->get() == s) {
                stats_clients_.erase(it);
                break;
            }
        }
    }
    retired_stats_.clear();
    retired_slots_.clear();
    if (accept_paused_) {
        accept_paused_ = false;
        clients_.w.want(EPOLLIN);
    }
}

void Proxy::tick() {
    const auto now = Clock::now();
    if (now - last_tick_ < std::chrono::milliseconds(100)) return;  // timeouts are coarse; the scan is O(connections)
    last_tick_ = now;
    for (auto& [id, c] : connections_)
        if (c->lingering() && now >= c->linger_deadline()) c->linger_timeout();
    for (auto it = slots_.begin(); it != slots_.end();) {
        Slot& s = *it->second;
        ++it;
        if (s.production_done && !s.debug_seen && now >= s.deadline) {
            ++stats.aggregator_unclaimed;
            maybe_drop_slot(s.ordinal);
        }
    }
    reap();
}

void Proxy::accept_clients(Acceptor& a) {
    for (int i = 0; i < 64; ++i) {
        UniqueFd fd(::accept4(a.w.fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
        if (!fd) {
            if (errno == EMFILE || errno == ENFILE) {
                log("out of file descriptors: not accepting until a connection closes");
                accept_paused_ = true;
                a.w.want(0);
            }
            return;
        }
        const std::uint32_t id = next_id_++;
        ++stats.accepted;
        ++stats.active;
        auto c = std::make_unique<Connection>(*this, id, std::move(fd));
        Connection* raw = c.get();
        connections_.emplace(id, std::move(c));
        std::optional<std::uint64_t> slot_ordinal;
        if (opt.upstream) slot_ordinal = next_production_ordinal_++;
        raw->start(slot_ordinal);
        if (raw->finished()) retire(raw);
    }
}

Slot& Proxy::slot(std::uint64_t ordinal) {
    auto& s = slots_[ordinal];
    if (!s) {
        s = std::make_unique<Slot>();
        s->px = this;
        s->ordinal = ordinal;
        s->replies = DebugBuffer(opt.buffer);
        if (opt.divergence != Protocol::off) s->requests = std::make_unique<StreamComparer>(opt.buffer);
    }
    return *s;
}

void Proxy::maybe_drop_slot(std::uint64_t ordinal) {
    auto it = slots_.find(ordinal);
    if (it == slots_.end()) return;
    Slot& s = *it->second;
    const bool debug_over = s.debug_done || (s.debug_seen && s.overflowed);
    const bool unclaimed = s.production_done && !s.debug_seen && Clock::now() >= s.deadline;
    if ((s.production_done && debug_over) || unclaimed) {
        s.close_debug();
        // freed after the current batch of events, which may still name it
        retired_slots_.push_back(std::move(it->second));
        slots_.erase(it);
    }
}

void Proxy::accept_debug_client(Acceptor& a) {
    for (int i = 0; i < 64; ++i) {
        UniqueFd fd(::accept4(a.w.fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
        if (!fd) return;
        const std::uint64_t ordinal = next_debug_ordinal_++;
        if (slots_.find(ordinal) == slots_.end() && ordinal < next_production_ordinal_) {
            // production's connection of this number came and went unclaimed
            ++stats.aggregator_debug_unmatched;
            rate_limited_log(stats.aggregator_debug_unmatched,
                             "the debug copy's upstream connection %llu has no production counterpart left; closing it",
                static_cast<unsigned long long>(ordinal));
            continue;
        }
        Slot& s = slot(ordinal);
        s.debug_seen = true;
        if (s.overflowed) {
            ++stats.aggregator_debug_unmatched;
            maybe_drop_slot(ordinal);
            continue;  // its replies were lost to an overflow: the debug copy gets a closed connection
        }
        ++stats.debug_connections;
        const int sndbuf = kDebugSendBuffer;  // as for duplicated connections: --buffer is the bound
        ::setsockopt(fd.get(), SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
        s.debug = Watched(epfd, std::move(fd), &s);
        s.flush();
    }
}

void Proxy::accept_stats(Acceptor& a) {
    for (int i = 0; i < 16; ++i) {
        UniqueFd fd(::accept4(a.w.fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
        if (!fd) return;
        auto s = std::make_unique<StatsClient>();
        s->px = this;
        s->w = Watched(epfd, std::move(fd), s.get());
        s->w.want(EPOLLIN);
        stats_clients_.insert(std::move(s));
    }
}

void Acceptor::on_event(std::uint32_t) {
    switch (kind) {
    case Kind::clients: px->accept_clients(*this); break;
    case Kind::debug_clients: px->accept_debug_client(*this); break;
    case Kind::stats: px->accept_stats(*this); break;
    }
}

void StatsClient::on_event(std::uint32_t events) {
    if (!responding) {
        const ssize_t n = ::recv(w.fd(), px->scratch, sizeof px->scratch, MSG_DONTWAIT);
        if (n > 0) request.append(reinterpret_cast<const char*>(px->scratch), static_cast<std::size_t>(n));
        const bool http = request.starts_with("GET ") || request.starts_with("HEAD ");
        const bool complete = request.find("\r\n\r\n") != std::string::npos ||
                              request.find("\n\n") != std::string::npos ||
                              (!http && request.find('\n') != std::string::npos);
        if (n < 0 && errno == EAGAIN) return;
        if (n > 0 && !complete && request.size() < 8192) return;
        const std::string body = px->stats_json(true) + "\n";
        std::string reply;
        if (request.starts_with("GET ") || request.starts_with("HEAD ")) {
            reply = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: " +
                    std::to_string(body.size()) + "\r\n\r\n";
        }
        if (!request.starts_with("HEAD ")) reply += body;
        out.add(reinterpret_cast<const std::uint8_t*>(reply.data()), reply.size());
        responding = true;
        events |= EPOLLOUT;
    }
    if (responding && (events & EPOLLOUT)) {
        std::size_t sent = 0;
        const SendResult r = send_some(w.fd(), reinterpret_cast<const std::uint8_t*>(out.bytes.data()) + out.offset,
                                       out.bytes.size() - out.offset, sent);
        out.offset += sent;
        if (r == SendResult::failed || out.empty()) {
            w.close();  // the peer sees the end only once the fd is gone
            px->retire(this);
            return;
        }
        w.want(EPOLLOUT);
    }
}

void SignalHandler::on_event(std::uint32_t) {
    signalfd_siginfo info{};
    while (::read(w.fd(), &info, sizeof info) == sizeof info) px->on_signal(static_cast<int>(info.ssi_signo));
}

void Proxy::on_signal(int sig) {
    if (sig == SIGUSR1) {
        const std::string s = stats_json(true);
        write_stderr_now(s + "\n");
        return;
    }
    stopping = true;
}

std::string Proxy::stats_json(bool with_connections) const {
    JsonWriter j;
    j.begin_object();
    j.field("mode", opt.upstream ? "aggregator" : "duplicator");
    j.field("uptime_s", ms_since(stats.started) / 1000.0);
    j.key("connections").begin_object();
    j.field("accepted", stats.accepted);
    j.field("active", stats.active);
    j.field("closed", stats.closed);
    j.field("lingering_debug", stats.lingering);
    j.field("production_connect_failures", stats.production_connect_failures);
    j.field("production_errors", stats.production_errors);
    j.end_object();
    j.key("bytes").begin_object();
    j.field("client_to_production", stats.bytes_client_to_production);
    j.field("production_to_client", stats.bytes_production_to_client);
    j.field("to_debug", stats.bytes_to_debug);
    j.field("from_debug", stats.bytes_from_debug);
    j.end_object();
    j.key("debug").begin_object();
    if (opt.debug) j.field("address", opt.debug->str());
    j.field("connections", stats.debug_connections);
    j.field("connect_failures", stats.debug_connect_failures);
    j.field("errors", stats.debug_errors);
    j.field("closed_early", stats.debug_closed_early);
    j.field("completed", stats.debug_completed);
    j.field("linger_timeouts", stats.debug_linger_timeouts);
    j.end_object();
    j.key("buffer").begin_object();
    j.field("per_connection_limit", static_cast<std::uint64_t>(opt.buffer));
    j.field("total_limit", static_cast<std::uint64_t>(opt.buffer_total));
    j.field("buffered", static_cast<std::uint64_t>(stats.buffered_now));
    j.field("high_water_total", static_cast<std::uint64_t>(stats.buffered_high_water));
    j.field("high_water_connection", static_cast<std::uint64_t>(stats.connection_high_water));
    j.field("overflows", stats.overflows);
    j.end_object();
    j.key("debug_windows_ms").begin_object();
    j.field("count", stats.windows_count);
    j.field("min", stats.windows_min);
    j.field("mean", stats.windows_count ? stats.windows_sum / static_cast<double>(stats.windows_count) : 0.0);
    j.field("max", stats.windows_max);
    j.key("recent").begin_array();
    for (double w : stats.windows_recent) j.value(w);
    j.end_array();
    j.end_object();
    j.key("divergence").begin_object();
    j.field("mode", protocol_name(opt.divergence));
    j.field("compared", stats.compared);
    j.field("ignored", stats.ignored);
    j.field("mismatches", stats.mismatches);
    j.field("diverged_connections", stats.diverged_connections);
    j.field("unchecked_connections", stats.unchecked_connections);
    j.key("reports").begin_array();
    for (const auto& r : stats.reports) {
        j.begin_object();
        j.field("connection", r.connection);
        j.field(opt.divergence == Protocol::stream || opt.upstream ? "byte_offset" : "reply_index", r.index);
        j.field("request", r.request);
        j.field("production", r.production);
        j.field("debug", r.debug);
        j.field("at_s", r.at_ms / 1000.0);
        j.end_object();
    }
    j.end_array();
    j.end_object();
    if (opt.upstream) {
        j.key("aggregator").begin_object();
        j.field("slots", static_cast<std::uint64_t>(slots_.size()));
        j.field("unclaimed_production_connections", stats.aggregator_unclaimed);
        j.field("unmatched_debug_connections", stats.aggregator_debug_unmatched);
        j.end_object();
    }
    if (recorder) {
        j.key("record").begin_object();
        j.field("path", recorder->path());
        j.field("records", recorder->records());
        j.field("stopped_early", recorder->stopped_early());
        j.end_object();
    }
    if (with_connections) {
        j.key("open_connections").begin_array();
        std::size_t shown = 0;
        for (const auto& [id, c] : connections_) {
            if (++shown > 100) break;
            c->describe(j);
        }
        j.end_array();
    }
    j.end_object();
    return j.str();
}

}  // namespace

void run_mirror(const MirrorOptions& options, const std::function<void(const MirrorReady&)>& on_ready) {
    Proxy proxy(options);
    on_ready(proxy.ready());
    proxy.run();
    const std::string final_stats = proxy.stats_json(false);
    if (options.json) {
        std::printf("{\"event\":\"stopped\",\"stats\":%s}\n", final_stats.c_str());
        std::fflush(stdout);
    } else if (!options.quiet) {
        std::fprintf(stderr, "iprobe mirror: stopped; final stats: %s\n", final_stats.c_str());
    }
}

}  // namespace iprobe::proxy
