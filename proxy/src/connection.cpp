// One client connection: the production passthrough and the debug leg fed from its bounded buffer.
#include "mirror_impl.h"

namespace iprobe::proxy::mirror_impl {

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

}  // namespace iprobe::proxy::mirror_impl
