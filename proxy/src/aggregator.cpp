// The aggregator's reply slots: production's replies from a backend, handed to
// the debug copy's matching connection.
#include "mirror_impl.h"

namespace iprobe::proxy::mirror_impl {

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

void Slot::production_request(const std::uint8_t* p, std::size_t n) { compare_requests(0, p, n); }

// Side 0 is production's request stream, 1 the debug copy's: the first
// difference is reported once per connection.
void Slot::compare_requests(int side, const std::uint8_t* p, std::size_t n) {
    if (!requests || reported) return;
    const auto r = requests->feed(side, {p, n});
    if (r == StreamComparer::Result::too_far_apart) requests.reset();
    if (r != StreamComparer::Result::mismatch) return;
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
            compare_requests(1, px->scratch, static_cast<std::size_t>(n));
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

}  // namespace iprobe::proxy::mirror_impl
