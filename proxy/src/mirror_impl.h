// The mirror's parts, shared by its files: the event loop (mirror.cpp), a
// client connection and its debug leg (connection.cpp), reply comparison
// (divergence.cpp), the aggregator's reply slots (aggregator.cpp), and the
// stats endpoint (stats_server.cpp).  Private to the proxy library.
#pragma once

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <fcntl.h>
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
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "iprobe/proxy/debug_buffer.h"
#include "reply_queues.h"
#include "iprobe/proxy/mirror.h"
#include "recording.h"
#include "iprobe/proxy/stats.h"
#include "iprobe/support/error.h"
#include "iprobe/proxy/stream_compare.h"
#include "iprobe/support/json.h"

namespace iprobe::proxy::mirror_impl {

using Clock = std::chrono::steady_clock;

inline constexpr std::size_t kReadChunk = 64 * 1024;
inline constexpr std::size_t kMaxPendingMessages = 65536;  // per connection, for the divergence checker
inline constexpr std::size_t kMaxReports = 100;
// A recording's queue toward its writer thread: past this the recording stops
// (counted) rather than slow production down.
inline constexpr std::size_t kRecordQueue = 256u << 20;
inline constexpr std::size_t kMaxWindows = 1000;
inline constexpr std::size_t kMaxListedConnections = 100;  // in the stats document
inline constexpr int kDebugSendBuffer = 64 * 1024;  // the kernel doubles it
// The debug copy's leg is served in batches: bytes for it are sent, and its
// replies read, once per kDebugBatch (or as soon as kDebugFlushNow bytes wait),
// so duplicating a request costs a fraction of a syscall instead of two, and
// the debug side never wakes the production path.  The copy lags by at most
// this much, which no debugging session notices.
inline constexpr auto kDebugBatch = std::chrono::milliseconds(5);
inline constexpr std::size_t kDebugFlushNow = 32 * 1024;

inline double ms_since(Clock::time_point t) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// Log lines must never stall the event loop (and with it production) when
// whoever holds our stderr pipe stops reading it: write only what the fd takes
// now, drop the rest.
void write_stderr_now(std::string_view text);

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
SendResult send_some(int fd, const std::uint8_t* p, std::size_t n, std::size_t& sent);

struct DivergenceReport {
    std::uint32_t connection;
    std::uint64_t index;  // message number in the connection (0-based) or byte offset (stream)
    std::string request;
    std::string production;
    std::string debug;
    double at_ms;
    std::uint32_t target = 0;  // which --debug copy
};

// Counters of one debug copy (one --debug address); Stats keeps their sums.
struct TargetCounters {
    std::uint64_t connections = 0, connect_failures = 0, errors = 0, closed_early = 0, completed = 0,
                  linger_timeouts = 0, overflows = 0, diverged_connections = 0, bytes = 0;
};

struct Stats {
    Clock::time_point started = Clock::now();
    std::uint64_t accepted = 0, active = 0, closed = 0;
    std::uint64_t production_connect_failures = 0, production_errors = 0;
    std::uint64_t bytes_client_to_production = 0, bytes_production_to_client = 0;
    std::uint64_t bytes_to_debug = 0, bytes_from_debug = 0;
    std::uint64_t debug_connections = 0, debug_connect_failures = 0, debug_errors = 0,
                  debug_closed_early = 0, debug_completed = 0, debug_linger_timeouts = 0;
    std::vector<TargetCounters> targets;  // one per --debug
    std::uint64_t lingering = 0;
    std::uint64_t overflows = 0;
    std::size_t buffered_now = 0, buffered_high_water = 0, connection_high_water = 0;
    std::uint64_t windows_count = 0;
    double windows_min = 0, windows_max = 0, windows_sum = 0;
    std::deque<double> windows_recent;
    std::uint64_t compared = 0, ignored = 0, mismatches = 0, diverged_connections = 0, unchecked_connections = 0;
    std::uint64_t reordered = 0;
    std::set<std::pair<std::uint32_t, std::uint32_t>> diverged_legs;  // (connection, target) reported
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
class MirroredStream;

// Replies of a copy that differ from production's are either the copy's own
// (it diverged) or only another interleaving of concurrent connections: the
// copy is fed each connection on its own, so two clients INCRementing one
// key see the counter's values dealt out differently.  A difference is
// `reordered` when the copy's reply is production's reply to the same
// request (same bytes) that production answered within kReorderWindow of
// this one, and whose own copy reply differed too; each production reply
// explains one difference at most.  Judged a second after the difference
// was seen (its partner may come later); the rest diverged.
class ReorderClassifier {
public:
    static constexpr auto kWindow = std::chrono::seconds(1);
    static constexpr auto kSettle = std::chrono::seconds(1);
    struct Mismatch {
        std::uint32_t connection = 0, target = 0;
        std::uint64_t request = 0, production = 0, copy = 0;  // hashes
        Clock::time_point production_at{}, seen_at{};
        std::uint64_t index = 0;
        std::string request_text, production_excerpt, copy_excerpt;
        bool classified = false, claimed = false;
    };
    explicit ReorderClassifier(Proxy& px) : px_(px) {}
    void add(Mismatch m);
    // `all`: the mirror stops; nothing waits for a partner any more.
    void classify(Clock::time_point now, bool all);
    std::uint64_t pending() const { return pending_; }

private:
    static std::uint64_t key(std::uint32_t target, std::uint64_t request, std::uint64_t reply);
    Proxy& px_;
    std::deque<Mismatch> list_;
    std::uint64_t first_id_ = 0;
    std::unordered_multimap<std::uint64_t, std::uint64_t> by_production_;  // key(production reply) -> id
    std::uint64_t pending_ = 0;
};

// One debug copy's side (one per --debug address) of one mirrored connection:
// its socket, the bounded buffer that feeds it the client's bytes, and the
// comparison of its replies with production's.  Fed the same way whether
// production's bytes pass through the proxy (Connection) or are captured off
// the wire (CapturedConnection).
class DebugLeg final : public Handler {
public:
    enum class State { none, connecting, open, done };

    DebugLeg(Proxy& px, MirroredStream& owner, std::uint32_t target);
    ~DebugLeg() override;
    DebugLeg(const DebugLeg&) = delete;
    DebugLeg& operator=(const DebugLeg&) = delete;

    // Connects to the debug copy and sets up reply comparison.
    void open();
    bool active() const { return state_ == State::connecting || state_ == State::open; }
    std::uint32_t target() const { return target_; }
    // The client's bytes, in order, queued for the copy.
    void forward(const std::uint8_t* p, std::size_t n);
    // No more client bytes: the copy's write side is shut once it has them all.
    void client_ended();
    // Divergence checking, fed by the owner (which frames requests and
    // production's replies once for all legs).
    void expect(const Message& request);
    void production_reply(const Message& reply);
    void production_bytes(std::span<const std::uint8_t> bytes);  // stream comparison
    void stop_checking(const std::string& why);  // why: counted and logged unless empty
    // The owner's connection is over: the leg lingers until the copy has every
    // byte, or finishes checking now.
    void source_closed();
    // The copy cannot be fed a whole stream any more (buffer overflow, bytes
    // lost to the capture): closed, never fed a hole.  `as` names the reason
    // in the stats' open connections ("overflowed").
    void abandon(const char* as);
    void close(const char* why, bool copy_finished = false);
    void linger_timeout();
    // Called by the proxy's debug pass for legs queued with Proxy::queue_debug_flush().
    void flush_batch();
    // Epoll interest from the state (connecting: writable; open: replies, and writable when backlogged).
    void watch();
    void on_event(std::uint32_t events) override;
    MirroredStream& owner() const { return owner_; }
    std::size_t buffered() const { return buffer_.size(); }
    MirrorStats::ConnectionStats::Leg snapshot(Clock::time_point now) const;
    bool in_flush_queue = false;

private:
    void connected();
    void overflow();
    void flush();
    void consumed(std::size_t n);
    void read_replies();
    void finish_checking();
    void copy_replies(std::span<const std::uint8_t> bytes);
    void compare_stream(int side, std::span<const std::uint8_t> bytes);
    void compare();
    void report(std::uint64_t index, const std::string& request, const std::string& prod, const std::string& dbg);
    TargetCounters& counters();

    Proxy& px_;
    MirroredStream& owner_;
    const std::uint32_t target_;
    Watched w_;
    State state_ = State::none;
    DebugBuffer buffer_;
    bool input_ended_ = false;     // the client sent all it will
    bool source_closed_ = false;   // the owner's connection is over: lingering while active
    bool backlogged_ = false;      // the socket refused bytes: wait for EPOLLOUT
    bool shut_ = false;            // our write side is shut down
    const char* abandoned_as_ = nullptr;
    // Arrival time of the bytes still buffered (coalesced per millisecond):
    // how far behind the stream this copy's socket is.
    struct Mark {
        std::uint64_t end;  // bytes appended up to and including this mark
        Clock::time_point at;
    };
    std::deque<Mark> marks_;
    std::uint64_t appended_ = 0, sent_ = 0;

    // divergence checking
    bool checking_ = false;
    bool reported_ = false;
    std::unique_ptr<Framer> reply_framer_;  // the copy's replies
    ReplyQueues queues_;
    std::vector<Message> scratch_;
    std::unique_ptr<StreamComparer> stream_;
};

// What every mirrored connection has, whether production's bytes pass through
// the proxy (Connection) or are captured off the wire (CapturedConnection): an
// id, a debug leg per --debug address, requests and production's replies
// framed once for all legs, and a life that ends when both its source and its
// legs have.
class MirroredStream {
public:
    MirroredStream(Proxy& px, std::uint32_t id);
    virtual ~MirroredStream();
    MirroredStream(const MirroredStream&) = delete;
    MirroredStream& operator=(const MirroredStream&) = delete;

    std::uint32_t id() const { return id_; }
    Clock::time_point started() const { return start_; }
    bool finished() const { return source_closed_ && !any_leg_active(); }
    bool lingering() const { return source_closed_ && any_leg_active(); }
    Clock::time_point linger_deadline() const { return linger_deadline_; }
    void linger_timeout();
    // After any I/O: watch what is still wanted, or hand a finished stream to
    // the proxy for removal.
    void settle();
    // A leg closed: the stream may have stopped lingering.
    void leg_closed();
    MirrorStats::ConnectionStats snapshot(Clock::time_point now) const;

protected:
    // The source's own epoll interest (the proxy's client and production sockets).
    virtual void update() {}
    virtual void describe_source(MirrorStats::ConnectionStats& s) const { (void)s; }

    // What the source saw, handed to every leg.
    void open_legs();
    void client_bytes(const std::uint8_t* p, std::size_t n);
    void client_ended();
    void production_bytes(const std::uint8_t* p, std::size_t n);
    // Production closed its side: a reply delimited by the close is complete.
    void production_ended();
    // Production's replies can no longer be followed: the copies are still
    // fed, their replies no longer compared.
    void stop_comparing(const std::string& why) { stop_framing(why); }
    void abandon_legs(const char* as);
    void close_legs();
    // The source is over (sets source_closed_): legs linger until their copies have every byte.
    void end_source();

    Proxy& px_;
    const std::uint32_t id_;
    const Clock::time_point start_ = Clock::now();
    bool source_closed_ = false;
    std::shared_ptr<Recorder> recorder_;  // the recording current when the connection opened

private:
    bool any_leg_active() const;
    void check_requests(const std::uint8_t* p, std::size_t n);
    void stop_framing(const std::string& why);

    std::vector<std::unique_ptr<DebugLeg>> legs_;
    Clock::time_point linger_deadline_{};
    bool lingering_counted_ = false;
    bool framing_ = false;
    std::unique_ptr<Framer> request_framer_, production_framer_;
    std::vector<Message> scratch_;
};

// One client connection through the proxy: client <-> production passthrough
// plus its debug legs.  In aggregator mode "client" is production's outbound
// connection and "production" the real backend.
class Connection final : public MirroredStream {
public:
    enum class Side { client, production };

    Connection(Proxy& px, std::uint32_t id, UniqueFd client);
    ~Connection() override;

    void on_event(Side side, std::uint32_t events);
    void start(std::optional<std::uint64_t> aggregator_slot);

private:
    struct Leg final : Handler {
        Connection* owner;
        Side side;
        Watched w;
        void on_event(std::uint32_t events) override { owner->on_event(side, events); }
    };

    void read_client();
    void read_production();
    void flush_production();
    void flush_client();
    void production_connected();
    void close_pair();
    void update() override;
    void maybe_finish_pair();

    Leg client_, prod_;
    Pending to_prod_, to_client_;
    bool prod_connecting_ = true;
    bool client_eof_ = false, prod_eof_ = false;
    bool prod_shut_ = false, client_shut_ = false;
    std::optional<std::uint64_t> slot_;
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
    void compare_requests(int side, const std::uint8_t* p, std::size_t n);
};

struct Acceptor final : Handler {
    Proxy* px;
    enum class Kind { clients, debug_clients, stats, hook } kind;
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

// The supervisor's commands on --control-fd, one JSON line each, each
// answered with one line on the same descriptor (see MirrorCommand).
struct ControlChannel final : Handler {
    Proxy* px;
    Watched w;
    std::string in;
    void on_event(std::uint32_t events) override;
};

class Capture;

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
    ReorderClassifier reorders{*this};
    // A copy's reply differed for good: counted, and the connection's first
    // reported (per copy).
    void diverged(std::uint32_t connection, std::uint32_t target, std::uint64_t index, const std::string& request,
                  const std::string& production, const std::string& copy);
    // New connections record into it; one that opened under an earlier
    // recording keeps writing there (see MirrorCommand::Kind::record).
    std::shared_ptr<Recorder> recorder;
    std::uint8_t scratch[kReadChunk];
    bool stopping = false;

    void accept_clients(Acceptor& a);
    void accept_debug_client(Acceptor& a);
    void accept_stats(Acceptor& a);
    void accept_hook(Acceptor& a);
    void retire(MirroredStream* c) { retired_.insert(c); }
    // Capture mode: connections are made by the capture, not accepted.
    std::uint32_t new_connection_id() { return next_id_++; }
    void adopt(std::unique_ptr<MirroredStream> c) { connections_.emplace(c->id(), std::move(c)); }
    void queue_debug_flush(DebugLeg* leg) {
        if (leg->in_flush_queue) return;
        leg->in_flush_queue = true;
        debug_queue_.push_back(leg);
    }
    void retire(StatsClient* s) { retired_stats_.insert(s); }
    void log(const char* fmt, ...) __attribute__((format(printf, 2, 3)));
    std::uint64_t now_ns() const {
        return static_cast<std::uint64_t>(
            std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - stats.started).count());
    }
    MirrorStats snapshot() const;
    std::string stats_json(bool pretty_connections) const;
    void note_buffered(std::ptrdiff_t delta) {
        stats.buffered_now = static_cast<std::size_t>(static_cast<std::ptrdiff_t>(stats.buffered_now) + delta);
        stats.buffered_high_water = std::max(stats.buffered_high_water, stats.buffered_now);
    }
    bool total_budget_allows(std::size_t n) const { return stats.buffered_now + n <= opt.buffer_total; }
    Slot& slot(std::uint64_t ordinal);
    void maybe_drop_slot(std::uint64_t ordinal);
    void on_signal(int sig);
    MirrorCommandReply execute(const MirrorCommand& command);
    void rate_limited_log(std::uint64_t count, const char* fmt, ...) __attribute__((format(printf, 3, 4)));

private:
    void tick();
    void reap();
    void debug_pass();
    int wait_timeout_ms() const;

    UniqueFd ep_, debug_ep_;
    std::unique_ptr<Capture> capture_;  // capture mode: the packet source instead of clients_
    std::vector<DebugLeg*> debug_queue_;  // bytes waiting for the next debug pass
    Clock::time_point last_debug_pass_{};
    Acceptor clients_, debug_clients_, stats_listener_, hook_listener_;
    SignalHandler signals_;
    ControlChannel control_;
    std::vector<std::unique_ptr<ControlChannel>> hook_channels_;  // the CRIU hook's connections
    std::map<std::uint32_t, std::unique_ptr<MirroredStream>> connections_;
    std::set<MirroredStream*> retired_;
    std::set<StatsClient*> retired_stats_;
    std::set<std::unique_ptr<StatsClient>> stats_clients_;
    std::map<std::uint64_t, std::unique_ptr<Slot>> slots_;
    std::vector<std::unique_ptr<Slot>> retired_slots_;
    std::uint64_t next_production_ordinal_ = 0, next_debug_ordinal_ = 0;
    std::uint32_t next_id_ = 1;
    bool accept_paused_ = false;
    Clock::time_point last_tick_{};
};

}  // namespace iprobe::proxy::mirror_impl
