// The stats endpoint and its document.
#include "capture.h"
#include "mirror_impl.h"
#include "iprobe/proxy/stats.h"

namespace iprobe::proxy::mirror_impl {

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

MirrorStats Proxy::snapshot() const {
    MirrorStats s;
    s.mode = opt.upstream ? "aggregator" : capture_ ? "capture" : "duplicator";
    s.uptime_s = ms_since(stats.started) / 1000.0;
    s.connections = {stats.accepted, stats.active, stats.closed, stats.lingering, stats.production_connect_failures,
                     stats.production_errors};
    s.bytes = {stats.bytes_client_to_production, stats.bytes_production_to_client, stats.bytes_to_debug,
               stats.bytes_from_debug};
    std::string addresses;
    for (const auto& d : opt.debug) addresses += (addresses.empty() ? "" : ",") + d.str();
    s.debug = {addresses, stats.debug_connections, stats.debug_connect_failures, stats.debug_errors,
               stats.debug_closed_early, stats.debug_completed, stats.debug_linger_timeouts};
    s.buffer = {static_cast<std::uint64_t>(opt.buffer),
                static_cast<std::uint64_t>(opt.buffer_total),
                static_cast<std::uint64_t>(stats.buffered_now),
                static_cast<std::uint64_t>(stats.buffered_high_water),
                static_cast<std::uint64_t>(stats.connection_high_water),
                stats.overflows};
    s.debug_windows_ms = {stats.windows_count, stats.windows_min,
                          stats.windows_count ? stats.windows_sum / static_cast<double>(stats.windows_count) : 0.0,
                          stats.windows_max, {stats.windows_recent.begin(), stats.windows_recent.end()}};
    s.divergence.mode = protocol_name(opt.divergence);
    s.divergence.compared = stats.compared;
    s.divergence.ignored = stats.ignored;
    s.divergence.mismatches = stats.mismatches;
    s.divergence.reordered = stats.reordered;
    s.divergence.unclassified = reorders.pending();
    s.divergence.diverged_connections = stats.diverged_connections;
    s.divergence.unchecked_connections = stats.unchecked_connections;
    const bool byte_offsets = opt.divergence == Protocol::stream || opt.upstream.has_value();
    for (const auto& r : stats.reports)
        s.divergence.reports.push_back({r.connection, r.index, byte_offsets, r.request, r.production, r.debug,
                                        r.at_ms / 1000.0, r.target});
    if (opt.upstream)
        s.aggregator = MirrorStats::Aggregator{static_cast<std::uint64_t>(slots_.size()), stats.aggregator_unclaimed,
                                               stats.aggregator_debug_unmatched};
    if (capture_) s.capture = capture_->snapshot();
    if (recorder) s.record = MirrorStats::Record{recorder->path(), recorder->records(), recorder->stopped_early()};
    s.debug_targets.resize(opt.debug.size());
    for (std::size_t t = 0; t < opt.debug.size(); ++t) {
        const TargetCounters& c = stats.targets[t];
        auto& d = s.debug_targets[t];
        d.address = opt.debug[t].str();
        d.connections = c.connections;
        d.connect_failures = c.connect_failures;
        d.overflows = c.overflows;
        d.diverged_connections = c.diverged_connections;
        d.bytes = c.bytes;
    }
    // How far behind each copy is now: the worst of its open connections.
    const auto now = Clock::now();
    for (const auto& [id, c] : connections_) {
        MirrorStats::ConnectionStats cs = c->snapshot(now);
        for (std::size_t t = 0; t < cs.debug.size() && t < s.debug_targets.size(); ++t) {
            const auto& leg = cs.debug[t];
            auto& d = s.debug_targets[t];
            if (leg.state == "open" || leg.state == "connecting") ++d.open_legs;
            d.buffered += leg.buffered;
            d.max_fill = std::max(d.max_fill, leg.fill);
            d.max_pending_ms = std::max(d.max_pending_ms, leg.pending_ms);
            d.max_reply_lag_ms = std::max(d.max_reply_lag_ms, leg.reply_lag_ms);
            d.replies_behind += leg.replies_behind;
        }
        if (s.open_connections.size() < kMaxListedConnections) s.open_connections.push_back(std::move(cs));
    }
    if (capture_) capture_->unfollowed(s.open_connections, kMaxListedConnections, now);
    return s;
}

std::string Proxy::stats_json(bool with_connections) const {
    MirrorStats s = snapshot();
    if (!with_connections) s.open_connections.clear();
    return to_json(s);
}

}  // namespace iprobe::proxy::mirror_impl
