// The debug copy's side of a mirrored connection (its socket, the bounded
// buffer feeding it, batching) and what every mirrored connection shares.
#include "mirror_impl.h"

namespace iprobe::proxy::mirror_impl {

MirroredStream::MirroredStream(Proxy& px, std::uint32_t id) : px_(px), id_(id), debug_(px, *this) {}

void MirroredStream::linger_timeout() {
    debug_.linger_timeout();
    px_.retire(this);
}

void MirroredStream::settle() {
    if (!finished()) {
        update();
        debug_.watch();
    }
    if (finished()) px_.retire(this);
}

void MirroredStream::describe(JsonWriter& j) const {
    j.begin_object();
    j.field("id", id_);
    j.field("age_ms", ms_since(start_));
    j.field("lingering", source_closed_);
    debug_.describe_fields(j);
    describe_source(j);
    j.end_object();
}

DebugLeg::DebugLeg(Proxy& px, MirroredStream& owner) : px_(px), owner_(owner), buffer_(px.opt.buffer) {}

DebugLeg::~DebugLeg() = default;

void DebugLeg::open() {
    if (!px_.opt.debug) return;
    UniqueFd d = start_connect(*px_.opt.debug);
    if (!d) {
        ++px_.stats.debug_connect_failures;
        px_.rate_limited_log(px_.stats.debug_connect_failures, "connection %u: debug copy %s unreachable: %s",
                             owner_.id(), px_.opt.debug->str().c_str(), std::strerror(errno));
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
        request_framer_ = Framer::create(px_.opt.divergence, Role::request, px_.opt.rules);
        reply_framer_[0] = Framer::create(px_.opt.divergence, Role::response, px_.opt.rules);
        reply_framer_[1] = Framer::create(px_.opt.divergence, Role::response, px_.opt.rules);
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
            px_.rate_limited_log(px_.stats.debug_connect_failures,
                                 "connection %u: cannot connect to debug copy %s: %s (production unaffected)",
                                 owner_.id(), px_.opt.debug->str().c_str(), std::strerror(err));
            close(nullptr);
        } else if (events & EPOLLOUT) {
            connected();
        }
    }
    if (state_ == State::open && (events & EPOLLOUT)) {
        backlogged_ = false;
        flush();
    }
    if (state_ == State::open && (events & (EPOLLIN | EPOLLHUP | EPOLLERR))) read_replies();
    owner_.settle();
}

void DebugLeg::connected() {
    state_ = State::open;
    ++px_.stats.debug_connections;
    const int one = 1;
    ::setsockopt(w_.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

void DebugLeg::watch() {
    if (state_ == State::connecting) {
        w_.want(EPOLLOUT);
    } else if (state_ == State::open) {
        w_.want(EPOLLIN | (backlogged_ ? static_cast<std::uint32_t>(EPOLLOUT) : 0u));
    }
}

void DebugLeg::client_bytes(const std::uint8_t* p, std::size_t n) {
    if (checking_) check_requests(p, n);
    forward(p, n);
}

void DebugLeg::client_ended() {
    input_ended_ = true;
    if (state_ == State::open && buffer_.empty() && !shut_) {
        ::shutdown(w_.fd(), SHUT_WR);
        shut_ = true;
    }
}

void DebugLeg::production_bytes(const std::uint8_t* p, std::size_t n) {
    if (checking_) check_replies(0, p, n);
}

void DebugLeg::production_ended() {
    if (!checking_ || !reply_framer_[0]) return;
    scratch_.clear();
    reply_framer_[0]->finish(scratch_);
    for (auto& m : scratch_) replies_[0].push_back(std::move(m));
    compare_messages();
}

void DebugLeg::forward(const std::uint8_t* p, std::size_t n) {
    if (!active()) return;
    if (!px_.total_budget_allows(n) || !buffer_.append(p, n)) {
        overflow();
        return;
    }
    px_.note_buffered(static_cast<std::ptrdiff_t>(n));
    px_.stats.connection_high_water = std::max(px_.stats.connection_high_water, buffer_.size());
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
    px_.stats.window(window);
    px_.rate_limited_log(px_.stats.overflows,
                         "connection %u: debug buffer full (%zu bytes) after %.1f ms: debug side closed, "
                         "connection marked diverged (production unaffected)",
                         owner_.id(), buffer_.size(), window);
    abandon("overflowed");
}

void DebugLeg::abandon(const char* as) {
    abandoned_as_ = as;
    close(nullptr);
}

void DebugLeg::flush() {
    while (!buffer_.empty()) {
        const auto front = buffer_.front();
        std::size_t sent = 0;
        const SendResult r = send_some(w_.fd(), front.data(), front.size(), sent);
        buffer_.consume(sent);
        px_.note_buffered(-static_cast<std::ptrdiff_t>(sent));
        px_.stats.bytes_to_debug += sent;
        if (r == SendResult::failed) {
            ++px_.stats.debug_errors;
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
            close("debug copy connection failed");
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
        if (shut_ && buffer_.empty()) ++px_.stats.debug_completed; else ++px_.stats.debug_closed_early;
        close(nullptr, true);
        return;
    }
    px_.stats.bytes_from_debug += static_cast<std::size_t>(n);
    if (checking_) check_replies(1, px_.scratch, static_cast<std::size_t>(n));
}

void DebugLeg::close(const char* why, bool copy_finished) {
    if (!active()) return;
    if (why) px_.rate_limited_log(px_.stats.debug_errors, "connection %u: %s (production unaffected)", owner_.id(), why);
    w_.close();
    state_ = State::done;
    px_.note_buffered(-static_cast<std::ptrdiff_t>(buffer_.size()));
    buffer_.clear();
    // A copy cut off by us (overflow, error) is behind, not different: stop
    // comparing.  One that closed by itself said all it had to say.
    if (!copy_finished) stop_checking("");
    if (source_closed_) {
        --px_.stats.lingering;
        finish_checking();
    }
}

void DebugLeg::source_closed() {
    if (source_closed_) return;
    source_closed_ = true;
    input_ended_ = true;
    if (active()) {
        ++px_.stats.lingering;
        linger_deadline_ = Clock::now() + std::chrono::milliseconds(static_cast<long>(px_.opt.debug_linger_s * 1000));
        if (state_ == State::open) flush();
    } else {
        finish_checking();
    }
}

void DebugLeg::linger_timeout() {
    ++px_.stats.debug_linger_timeouts;
    px_.rate_limited_log(px_.stats.debug_linger_timeouts,
                         "connection %u: debug copy did not finish within %.0f s after the client left; %zu bytes "
                         "undelivered",
                         owner_.id(), px_.opt.debug_linger_s, buffer_.size());
    close(nullptr);
}

// Both streams have ended: any reply production sent that the debug copy
// never did (or the reverse) is a divergence.
void DebugLeg::finish_checking() {
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

void DebugLeg::describe_fields(JsonWriter& j) const {
    j.field("debug", state_ == State::open         ? "open"
                     : state_ == State::connecting ? "connecting"
                     : abandoned_as_               ? abandoned_as_
                                                   : "none");
    j.field("debug_buffered", static_cast<std::uint64_t>(buffer_.size()));
    j.field("debug_buffer_high_water", static_cast<std::uint64_t>(buffer_.high_water()));
}

}  // namespace iprobe::proxy::mirror_impl
