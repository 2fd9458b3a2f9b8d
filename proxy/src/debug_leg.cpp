// A debug copy's side of one client connection: connect, feed from the
// bounded buffer in batches, drain its replies, close on overflow.
#include "mirror_impl.h"

namespace iprobe::proxy::mirror_impl {

DebugLeg::DebugLeg(Connection& owner, Proxy& px, std::uint32_t target, UniqueFd fd)
    : owner_(owner), px_(px), target_(target), buffer_(px.opt.buffer) {
    // A fixed, small kernel send buffer: left to autotuning it grows to
    // megabytes and would hide a stalled debug copy from --buffer.
    const int sndbuf = kDebugSendBuffer;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
    w_ = Watched(px.debug_epfd, std::move(fd), this);
    w_.want(EPOLLOUT);
    if (px.opt.divergence == Protocol::stream) {
        stream_ = std::make_unique<StreamComparer>(px.opt.buffer);
        checking_ = true;
    } else if (px.opt.divergence != Protocol::off) {
        reply_framer_ = Framer::create(px.opt.divergence, Role::response, px.opt.rules);
        checking_ = true;
    }
}

DebugLeg::~DebugLeg() { close(nullptr); }

void DebugLeg::on_event(std::uint32_t events) {
    if (state_ == State::connecting) {
        int err = 0;
        socklen_t len = sizeof err;
        ::getsockopt(w_.fd(), SOL_SOCKET, SO_ERROR, &err, &len);
        if (err != 0) {
            ++px_.stats.debug_connect_failures;
            ++px_.stats.targets[target_].connect_failures;
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
        if (state_ == State::open && (events & (EPOLLIN | EPOLLHUP | EPOLLERR))) read();
    }
    watch();
    owner_.settle();
}

void DebugLeg::watch() {
    if (state_ == State::open) w_.want(EPOLLIN | (backlogged_ ? static_cast<std::uint32_t>(EPOLLOUT) : 0u));
}

void DebugLeg::connected() {
    state_ = State::open;
    ++px_.stats.debug_connections;
    ++px_.stats.targets[target_].connections;
    const int one = 1;
    ::setsockopt(w_.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    flush();
}

void DebugLeg::mirror(const std::uint8_t* p, std::size_t n) {
    if (state_ == State::done) return;
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
    if (buffer_.size() >= std::min(kDebugFlushNow, buffer_.capacity() / 4)) {
        flush();
        watch();
    } else {
        px_.queue_debug_flush(&owner_);
    }
}

void DebugLeg::flush_batch() {
    if (state_ != State::open || backlogged_) return;
    flush();
    watch();
}

void DebugLeg::consumed(std::size_t n) {
    buffer_.consume(n);
    sent_ += n;
    while (!marks_.empty() && marks_.front().end <= sent_) marks_.pop_front();
    px_.note_buffered(-static_cast<std::ptrdiff_t>(n));
    px_.stats.bytes_to_debug += n;
    px_.stats.targets[target_].bytes += n;
}

void DebugLeg::flush() {
    while (!buffer_.empty()) {
        const auto front = buffer_.front();
        std::size_t sent = 0;
        const SendResult r = send_some(w_.fd(), front.data(), front.size(), sent);
        consumed(sent);
        if (r == SendResult::failed) {
            ++px_.stats.debug_errors;
            ++px_.stats.targets[target_].errors;
            close("write to debug copy failed");
            return;
        }
        if (r == SendResult::again) {
            backlogged_ = true;
            return;
        }
    }
    if (owner_.client_done() && !shut_) {
        ::shutdown(w_.fd(), SHUT_WR);
        shut_ = true;
    }
}

void DebugLeg::client_done() {
    if (state_ != State::open || backlogged_) return;
    flush();
    watch();
}

void DebugLeg::overflow() {
    overflowed_ = true;
    const double window = ms_since(owner_.started());
    ++px_.stats.overflows;
    ++px_.stats.targets[target_].overflows;
    px_.stats.window(window);
    px_.rate_limited_log(px_.stats.overflows,
                         "connection %u: debug buffer full (%zu bytes) after %.1f ms: the side to debug copy %s closed, "
                         "connection marked diverged (production unaffected)",
                         owner_.id(), buffer_.size(), window, px_.opt.debug[target_].str().c_str());
    close(nullptr);
}

void DebugLeg::read() {
    const ssize_t n = ::recv(w_.fd(), px_.scratch, sizeof px_.scratch, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n <= 0) {
        if (n < 0) {
            ++px_.stats.debug_errors;
            ++px_.stats.targets[target_].errors;
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
            ++px_.stats.targets[target_].completed;
        } else {
            ++px_.stats.debug_closed_early;
            ++px_.stats.targets[target_].closed_early;
        }
        close(nullptr, true);
        return;
    }
    px_.stats.bytes_from_debug += static_cast<std::size_t>(n);
    if (checking_) copy_replies({px_.scratch, static_cast<std::size_t>(n)});
}

void DebugLeg::close(const char* why, bool copy_finished) {
    if (state_ == State::done) return;
    if (why) px_.rate_limited_log(px_.stats.debug_errors, "connection %u: %s (production unaffected)", owner_.id(), why);
    w_.close();
    state_ = State::done;
    px_.note_buffered(-static_cast<std::ptrdiff_t>(buffer_.size()));
    buffer_.clear();
    marks_.clear();
    // A copy cut off by us (overflow, error) is behind, not different: stop
    // comparing.  One that closed by itself said all it had to say.
    if (!copy_finished) stop_checking("");
    owner_.leg_closed();
}

void DebugLeg::linger_timeout() {
    if (state_ == State::done) return;
    ++px_.stats.debug_linger_timeouts;
    ++px_.stats.targets[target_].linger_timeouts;
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
              : overflowed_                 ? "overflowed"
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
