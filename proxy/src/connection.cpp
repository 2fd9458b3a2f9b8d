// One client connection through the proxy: the production passthrough; its
// debug legs, one per debug copy, are DebugLegs (debug_leg.cpp).
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

Connection::Connection(Proxy& px, std::uint32_t id, UniqueFd client) : MirroredStream(px, id) {
    client_.owner = prod_.owner = this;
    client_.side = Side::client;
    prod_.side = Side::production;
    client_.w = Watched(px.epfd, std::move(client), &client_);
}

Connection::~Connection() {
    if (!source_closed_) close_pair();
}

void Connection::start(std::optional<std::uint64_t> aggregator_slot) {
    slot_ = aggregator_slot;
    const int one = 1;
    ::setsockopt(client_.w.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (recorder_) recorder_->add(RecordKind::open, id_, px_.now_ns());
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
    open_legs();
    update();
}

void Connection::on_event(Side side, std::uint32_t events) {
    if (source_closed_) return;
    switch (side) {
    case Side::client:
        if (events & EPOLLOUT) flush_client();
        if (!source_closed_ && (events & (EPOLLIN | EPOLLHUP | EPOLLERR))) read_client();
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
        if (!source_closed_ && (events & (EPOLLIN | EPOLLHUP | EPOLLERR))) read_production();
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
        if (recorder_) recorder_->add(RecordKind::close, id_, px_.now_ns());
        if (to_prod_.empty() && !prod_connecting_ && !prod_shut_) {
            ::shutdown(prod_.w.fd(), SHUT_WR);
            prod_shut_ = true;
        }
        client_ended();
        maybe_finish_pair();
        return;
    }
    const auto* p = px_.scratch;
    const auto size = static_cast<std::size_t>(n);
    px_.stats.bytes_client_to_production += size;
    if (recorder_) recorder_->add(RecordKind::data, id_, px_.now_ns(), p, size);
    if (slot_) px_.slot(*slot_).production_request(p, size);
    client_bytes(p, size);
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
        production_ended();
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
    if (recorder_) recorder_->add(RecordKind::reply, id_, px_.now_ns(), p, size);
    if (slot_) px_.slot(*slot_).add_reply(p, size);
    production_bytes(p, size);
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
    if (!source_closed_ && client_eof_ && prod_eof_ && to_prod_.empty() && to_client_.empty()) close_pair();
}

void Connection::close_pair() {
    if (source_closed_) return;
    if (recorder_ && !client_eof_) recorder_->add(RecordKind::close, id_, px_.now_ns());
    recorder_.reset();
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
    end_source();
}

void Connection::update() {
    if (source_closed_) return;
    std::uint32_t c = 0, p = 0;
    if (!client_eof_ && to_prod_.empty()) c |= EPOLLIN;
    if (!to_client_.empty()) c |= EPOLLOUT;
    if (prod_connecting_ || !to_prod_.empty()) p |= EPOLLOUT;
    if (!prod_connecting_ && !prod_eof_ && to_client_.empty()) p |= EPOLLIN;
    client_.w.want(c);
    prod_.w.want(p);
}

}  // namespace iprobe::proxy::mirror_impl
