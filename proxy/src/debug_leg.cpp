// A debug copy's side of a mirrored connection (its socket, the bounded
// buffer feeding it, batching), one per --debug address, and what every
// mirrored connection shares: its legs and their feeding.
#include "mirror_impl.h"

namespace iprobe::proxy::mirror_impl {

MirroredStream::MirroredStream(Proxy& px, std::uint32_t id) : px_(px), id_(id), recorder_(px.recorder) {}

// Legs still open give their buffered bytes back to the proxy's total.
MirroredStream::~MirroredStream() { close_legs(); }

void MirroredStream::open_legs() {
    for (std::uint32_t t = 0; t < px_.opt.debug.size(); ++t) {
        legs_.push_back(std::make_unique<DebugLeg>(px_, *this, t));
        legs_.back()->open();
    }
    if (!legs_.empty() && px_.opt.divergence != Protocol::off && px_.opt.divergence != Protocol::stream) {
        request_framer_ = Framer::create(px_.opt.divergence, Role::request, px_.opt.rules);
        production_framer_ = Framer::create(px_.opt.divergence, Role::response, px_.opt.rules);
        framing_ = true;
    }
}

bool MirroredStream::any_leg_active() const {
    for (const auto& leg : legs_)
        if (leg->active()) return true;
    return false;
}

void MirroredStream::client_bytes(const std::uint8_t* p, std::size_t n) {
    if (framing_) check_requests(p, n);
    for (auto& leg : legs_) leg->forward(p, n);
}

void MirroredStream::client_ended() {
    for (auto& leg : legs_) leg->client_ended();
}

void MirroredStream::abandon_legs(const char* as) {
    for (auto& leg : legs_) leg->abandon(as);
}

void MirroredStream::close_legs() {
    for (auto& leg : legs_) leg->close(nullptr);
}

void MirroredStream::end_source() {
    if (source_closed_) return;
    source_closed_ = true;
    if (any_leg_active()) {
        ++px_.stats.lingering;
        lingering_counted_ = true;
        linger_deadline_ = Clock::now() + std::chrono::milliseconds(static_cast<long>(px_.opt.debug_linger_s * 1000));
    }
    for (auto& leg : legs_) leg->source_closed();
}

void MirroredStream::leg_closed() {
    if (lingering_counted_ && !any_leg_active()) {
        lingering_counted_ = false;
        --px_.stats.lingering;
    }
}

void MirroredStream::linger_timeout() {
    for (auto& leg : legs_) leg->linger_timeout();
    px_.retire(this);
}

void MirroredStream::settle() {
    if (!finished()) {
        update();
        for (auto& leg : legs_) leg->watch();
    }
    if (finished()) px_.retire(this);
}

MirrorStats::ConnectionStats MirroredStream::snapshot(Clock::time_point now) const {
    MirrorStats::ConnectionStats s;
    s.id = id_;
    s.age_ms = std::chrono::duration<double, std::milli>(now - start_).count();
    s.lingering = source_closed_;
    for (const auto& leg : legs_) s.debug.push_back(leg->snapshot(now));
    describe_source(s);
    return s;
}

DebugLeg::DebugLeg(Proxy& px, MirroredStream& owner, std::uint32_t target)
    : px_(px), owner_(owner), target_(target), buffer_(px.opt.buffer) {}

DebugLeg::~DebugLeg() = default;

TargetCounters& DebugLeg::counters() { return px_.stats.targets[target_]; }

void DebugLeg::open() {
    UniqueFd d = start_connect(px_.opt.debug[target_]);
    if (!d) {
        ++px_.stats.debug_connect_failures;
        ++counters().connect_failures;
        px_.rate_limited_log(px_.stats.debug_connect_failures, "connection %u: debug copy %s unreachable: %s",
                             owner_.id(), px_.opt.debug[target_].str().c_str(), std::strerror(errno));
        return;
    }
    // A fixed, small kernel send buffer: left to autotuning it grows to
    // megabytes and would hide a stalled debug copy from --buffer.
    const int sndbuf = kDebugSendBuffer;
    ::setsockopt(d.get(), SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
    w_ = Watched(px_.debug_epfd, std::move(d), this);
    state_ = State::connecting;
    if (px_.opt.divergence == Protocol::stream) {
        stream_ = std::make_unique<StreamComparer>(px_.opt.buffer);
        checking_ = true;
    } else if (px_.opt.divergence != Protocol::off) {
        reply_framer_ = Framer::create(px_.opt.divergence, Role::response, px_.opt.rules);
        checking_ = true;
    }
    watch();
}

void DebugLeg::on_event(std::uint32_t events) {
    if (state_ == State::connecting) {
        int err = 0;
        socklen_t len = sizeof err;
        ::getsockopt(w_.fd(), SOL_SOCKET, SO_ERROR, &err, &len);
        if (err != 0) {
            ++px_.stats.debug_connect_failures;
            ++counters().connect_failures;
            px_.rate_limited_log(px_.stats.debug_connect_failures,
                                 "connection %u: cannot connect to debug copy %s: %s (production unaffected)",
                                 owner_.id(), px_.opt.debug[target_].str().c_str(), std::strerror(err));
            close(nullptr);
        } else if (events & EPOLLOUT) {
            connected();
        }
    } else {
        if (state_ == State::open && (events & EPOLLOUT)) {
            backlogged_ = false;
            flush();
        }
        if (state_ == State::open && (events & (EPOLLIN | EPOLLHUP | EPOLLERR))) read_replies();
    }
    owner_.settle();
}

void DebugLeg::connected() {
    state_ = State::open;
    ++px_.stats.debug_connections;
    ++counters().connections;
    const int one = 1;
    ::setsockopt(w_.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    flush();
}

void DebugLeg::watch() {
    if (state_ == State::connecting) {
        w_.want(EPOLLOUT);
    } else if (state_ == State::open) {
        w_.want(EPOLLIN | (backlogged_ ? static_cast<std::uint32_t>(EPOLLOUT) : 0u));
    }
}

void DebugLeg::client_ended() {
    input_ended_ = true;
    if (state_ == State::open && !backlogged_) flush();
}

void DebugLeg::forward(const std::uint8_t* p, std::size_t n) {
    if (!active()) return;
    if (!px_.total_budget_allows(n) || !buffer_.append(p, n)) {
        overflow();
        return;
    }
    px_.note_buffered(static_cast<std::ptrdiff_t>(n));
    px_.stats.connection_high_water = std::max(px_.stats.connection_high_water, buffer_.size());
    appended_ += n;
    const auto now = Clock::now();
    if (!marks_.empty() && now - marks_.back().at < std::chrono::milliseconds(1))
        marks_.back().end = appended_;
    else
        marks_.push_back({appended_, now});
    if (state_ != State::open || backlogged_) return;
    if (buffer_.size() >= std::min(kDebugFlushNow, buffer_.capacity() / 4))
        flush();
    else
        px_.queue_debug_flush(this);
}

void DebugLeg::flush_batch() {
    in_flush_queue = false;
    if (state_ != State::open || backlogged_) return;
    flush();
    owner_.settle();
}

void DebugLeg::overflow() {
    const double window = ms_since(owner_.started());
    ++px_.stats.overflows;
    ++counters().overflows;
    px_.stats.window(window);
    px_.rate_limited_log(px_.stats.overflows,
                         "connection %u: debug buffer full (%zu bytes) after %.1f ms: the side to debug copy %s "
                         "closed, connection marked diverged (production unaffected)",
                         owner_.id(), buffer_.size(), window, px_.opt.debug[target_].str().c_str());
    abandon("overflowed");
}

void DebugLeg::abandon(const char* as) {
    if (!active()) return;
    abandoned_as_ = as;
    close(nullptr);
}

void DebugLeg::consumed(std::size_t n) {
    buffer_.consume(n);
    sent_ += n;
    while (!marks_.empty() && marks_.front().end <= sent_) marks_.pop_front();
    px_.note_buffered(-static_cast<std::ptrdiff_t>(n));
    px_.stats.bytes_to_debug += n;
    counters().bytes += n;
}

void DebugLeg::flush() {
    while (!buffer_.empty()) {
        const auto front = buffer_.front();
        std::size_t sent = 0;
        const SendResult r = send_some(w_.fd(), front.data(), front.size(), sent);
        consumed(sent);
        if (r == SendResult::failed) {
            ++px_.stats.debug_errors;
            ++counters().errors;
            close("write to debug copy failed");
            return;
        }
        if (r == SendResult::again) {
            backlogged_ = true;
            return;
        }
    }
    if (input_ended_ && !shut_) {
        ::shutdown(w_.fd(), SHUT_WR);
        shut_ = true;
    }
}

void DebugLeg::read_replies() {
    const ssize_t n = ::recv(w_.fd(), px_.scratch, sizeof px_.scratch, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n <= 0) {
        if (n < 0) {
            ++px_.stats.debug_errors;
            ++counters().errors;
            close("debug copy connection failed");
            return;
        }
        if (checking_ && reply_framer_) {
            scratch_.clear();
            reply_framer_->finish(scratch_);
            for (auto& m : scratch_) queues_.replies[1].push_back(std::move(m));
            compare();
        }
        // Servers that close after answering (HTTP/1.0) end here too: the
        // replies they sent are still compared as production's arrive.
        if (shut_ && buffer_.empty()) {
            ++px_.stats.debug_completed;
            ++counters().completed;
        } else {
            ++px_.stats.debug_closed_early;
            ++counters().closed_early;
        }
        close(nullptr, true);
        return;
    }
    px_.stats.bytes_from_debug += static_cast<std::size_t>(n);
    if (checking_) copy_replies({px_.scratch, static_cast<std::size_t>(n)});
}

void DebugLeg::close(const char* why, bool copy_finished) {
    if (!active()) return;
    if (why)
        px_.rate_limited_log(px_.stats.debug_errors, "connection %u: debug copy %s: %s (production unaffected)",
                             owner_.id(), px_.opt.debug[target_].str().c_str(), why);
    w_.close();
    state_ = State::done;
    px_.note_buffered(-static_cast<std::ptrdiff_t>(buffer_.size()));
    buffer_.clear();
    marks_.clear();
    // A copy cut off by us (overflow, error) is behind, not different: stop
    // comparing.  One that closed by itself said all it had to say.
    if (!copy_finished) stop_checking("");
    if (source_closed_) finish_checking();
    owner_.leg_closed();
}

void DebugLeg::source_closed() {
    if (source_closed_) return;
    source_closed_ = true;
    input_ended_ = true;
    if (state_ == State::open) flush();
    if (!active()) finish_checking();
}

void DebugLeg::linger_timeout() {
    if (!active()) return;
    ++px_.stats.debug_linger_timeouts;
    ++counters().linger_timeouts;
    px_.rate_limited_log(px_.stats.debug_linger_timeouts,
                         "connection %u: debug copy %s did not finish within %.0f s after the client left; %zu bytes "
                         "undelivered",
                         owner_.id(), px_.opt.debug[target_].str().c_str(), px_.opt.debug_linger_s, buffer_.size());
    close(nullptr);
}

MirrorStats::ConnectionStats::Leg DebugLeg::snapshot(Clock::time_point now) const {
    MirrorStats::ConnectionStats::Leg s;
    s.state = state_ == State::open         ? "open"
              : state_ == State::connecting ? "connecting"
              : abandoned_as_               ? abandoned_as_
                                            : "closed";
    s.buffered = buffer_.size();
    s.high_water = buffer_.high_water();
    s.fill = buffer_.capacity() ? static_cast<double>(buffer_.size()) / static_cast<double>(buffer_.capacity()) : 0;
    const auto age = [&](Clock::time_point t) { return std::chrono::duration<double, std::milli>(now - t).count(); };
    if (!marks_.empty()) s.pending_ms = age(marks_.front().at);
    s.replies_behind = queues_.replies[0].size();
    if (!queues_.reference_at.empty()) s.reply_lag_ms = age(queues_.reference_at.front());
    return s;
}

}  // namespace iprobe::proxy::mirror_impl
