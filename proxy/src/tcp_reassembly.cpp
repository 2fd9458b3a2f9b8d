#include "iprobe/proxy/tcp_reassembly.h"

#include <algorithm>
#include <iterator>

namespace iprobe::proxy {

namespace {

// Bytes further ahead than any TCP window (2^30 with scaling) are not this
// connection's: a stale segment from an earlier use of the same ports.
constexpr std::uint64_t kMaxAhead = std::uint64_t(1) << 30;

}  // namespace

const char* stream_loss_name(StreamLoss why) {
    switch (why) {
    case StreamLoss::unplaced: return "unplaced";
    case StreamLoss::reassembly_full: return "reassembly_full";
    case StreamLoss::truncated: return "truncated";
    case StreamLoss::acknowledged_unseen: return "acknowledged_unseen";
    case StreamLoss::dropped_while_silent: return "dropped_while_silent";
    case StreamLoss::production_received_more: return "production_received_more";
    }
    return "unknown";
}

const char* stream_loss_words(StreamLoss why) {
    switch (why) {
    case StreamLoss::unplaced: return "bytes came before the capture knew where the stream starts";
    case StreamLoss::reassembly_full: return "more out-of-order bytes than the reassembly buffer holds";
    case StreamLoss::truncated: return "a packet was cut short by the snap length";
    case StreamLoss::acknowledged_unseen: return "the receiver acknowledged bytes the capture never saw";
    case StreamLoss::dropped_while_silent:
        return "the kernel dropped captured packets and the server never acknowledged what was seen";
    case StreamLoss::production_received_more: return "production's socket received more than the capture saw";
    }
    return "unknown";
}

TcpStreamReassembler::TcpStreamReassembler(std::size_t max_pending, Deliver deliver)
    : max_pending_(max_pending), deliver_(std::move(deliver)) {}

void TcpStreamReassembler::start(std::uint32_t seq) {
    // Positions start one 2^32 turn up, so a sequence number a little before
    // the start (a retransmission from before a join) still has one.
    first_ = next_ = (std::uint64_t(1) << 32) | seq;
    started_ = true;
    fin_at_ = 0;
    seen_end_ = acked_ = next_;
    pending_.clear();
    pending_bytes_ = 0;
}

std::uint64_t TcpStreamReassembler::position(std::uint32_t seq) const {
    const auto delta = static_cast<std::int32_t>(seq - static_cast<std::uint32_t>(next_));
    return static_cast<std::uint64_t>(static_cast<std::int64_t>(next_) + delta);
}

bool TcpStreamReassembler::behind(std::uint32_t seq, std::size_t length) const {
    return started_ && position(seq) + length <= next_;
}

void TcpStreamReassembler::acknowledged(std::uint32_t ack) {
    if (started_) acked_ = std::max(acked_, position(ack));
}

TcpStreamReassembler::Added TcpStreamReassembler::add(std::uint32_t seq, std::span<const std::uint8_t> payload) {
    if (!started_ || payload.empty()) return Added::duplicate;
    std::uint64_t at = position(seq);
    const std::uint64_t end = at + payload.size();
    if (end > next_ && end - next_ <= kMaxAhead) seen_end_ = std::max(seen_end_, end);
    if (end <= next_) {
        counters_.retransmitted_bytes += payload.size();
        return Added::duplicate;
    }
    if (at < next_) {
        counters_.retransmitted_bytes += next_ - at;
        payload = payload.subspan(static_cast<std::size_t>(next_ - at));
        at = next_;
    }
    if (at - next_ > kMaxAhead) return Added::duplicate;
    if (at == next_) {
        next_ = end;
        deliver_(payload);
        release();
        return Added::delivered;
    }
    ++counters_.out_of_order_segments;
    if (pending_bytes_ + payload.size() > max_pending_) return Added::overflow;
    const std::size_t before = pending_bytes_;
    keep(at, payload);
    return pending_bytes_ > before ? Added::waiting : Added::duplicate;
}

// Stores the parts of [at, at + size) no waiting segment covers yet.
void TcpStreamReassembler::keep(std::uint64_t at, std::span<const std::uint8_t> bytes) {
    const std::uint64_t base = at, end = at + bytes.size();
    const auto store = [&](std::uint64_t from, std::uint64_t to) {
        const auto* p = bytes.data() + (from - base);
        pending_.emplace(from, std::vector<std::uint8_t>(p, p + (to - from)));
        pending_bytes_ += static_cast<std::size_t>(to - from);
    };
    if (auto it = pending_.upper_bound(at); it != pending_.begin()) {
        const auto prev = std::prev(it);
        const std::uint64_t prev_end = prev->first + prev->second.size();
        if (prev_end > at) {
            const std::uint64_t covered_to = std::min(prev_end, end);
            counters_.overlapping_bytes += covered_to - at;
            at = covered_to;
        }
    }
    while (at < end) {
        const auto it = pending_.lower_bound(at);
        const std::uint64_t stop = (it == pending_.end() || it->first >= end) ? end : it->first;
        if (stop > at) store(at, stop);
        if (stop == end) break;
        const std::uint64_t covered_to = std::min<std::uint64_t>(it->first + it->second.size(), end);
        counters_.overlapping_bytes += covered_to - it->first;
        at = covered_to;
    }
}

// Delivers waiting segments the stream has caught up with.
void TcpStreamReassembler::release() {
    while (!pending_.empty() && pending_.begin()->first <= next_) {
        auto node = pending_.extract(pending_.begin());
        const std::vector<std::uint8_t>& bytes = node.mapped();
        pending_bytes_ -= bytes.size();
        const std::uint64_t at = node.key(), end = at + bytes.size();
        if (end <= next_) {
            counters_.overlapping_bytes += bytes.size();
            continue;
        }
        const auto skip = static_cast<std::size_t>(next_ - at);
        counters_.overlapping_bytes += skip;
        next_ = end;
        deliver_(std::span(bytes).subspan(skip));
    }
}

void TcpStreamReassembler::fin(std::uint32_t seq) {
    if (!started_) return;
    if (fin_at_ == 0) fin_at_ = position(seq);
    seen_end_ = std::max(seen_end_, fin_at_ + 1);
}

bool TcpStreamReassembler::acknowledged_hole(std::uint32_t ack) const {
    if (!started_) return false;
    const std::uint64_t acked = position(ack);
    return acked > next_ + (ended() ? 1 : 0);  // a FIN takes one sequence number
}

TcpConnectionTracker::TcpConnectionTracker(std::size_t max_pending, RequestStart request_start, TcpFlowSink& sink)
    : request_start_(request_start),
      sink_(sink),
      client_(max_pending, [this](std::span<const std::uint8_t> b) { sink_.flow_bytes(FlowDirection::to_server, b); }),
      server_(max_pending, [this](std::span<const std::uint8_t> b) { sink_.flow_bytes(FlowDirection::to_client, b); }) {}

void TcpConnectionTracker::segment(FlowDirection dir, const TcpSegment& s) {
    switch (phase_) {
    case Phase::closed:
        return;
    case Phase::open:
        follow(dir, s);
        return;
    case Phase::joining:
        if (dir == FlowDirection::to_server && s.has(TcpSegment::kSyn) && !s.has(TcpSegment::kAck)) {
            open_from_syn(s);
            return;
        }
        if (request_start_ && !s.has(TcpSegment::kRst) && dir == FlowDirection::to_server &&
            s.has(TcpSegment::kAck) && s.missing == 0 && !s.payload.empty() && request_start_(s.payload)) {
            join(s);
            return;
        }
        if (!request_start_) phase_ = Phase::unjoinable;
        if (phase_ == Phase::joining) hold(dir, s);
        [[fallthrough]];
    case Phase::unjoinable:
        // Followed no further than to know when it is over.
        if (s.has(TcpSegment::kFin)) fin_seen_[index(dir)] = true;
        if (s.has(TcpSegment::kRst) || (fin_seen_[0] && fin_seen_[1])) {
            phase_ = Phase::closed;
            held_.clear();
        }
        return;
    }
}

void TcpConnectionTracker::open_from_syn(const TcpSegment& s) {
    phase_ = Phase::open;
    held_.clear();
    client_.start(s.seq + 1);
    sink_.flow_opened(false);
    if (!s.payload.empty()) client_.add(s.seq + 1, s.payload);
}

// The client's segment `s` starts a request: the client stream starts there,
// the server's at what `s` acknowledges (the client had every reply before it).
void TcpConnectionTracker::join(const TcpSegment& s) {
    phase_ = Phase::open;
    lost_[0] = lost_[1] = ended_[0] = ended_[1] = fin_seen_[0] = fin_seen_[1] = false;
    suspected_[0] = suspected_[1] = false;
    client_.start(s.seq);
    server_.start(s.ack);
    sink_.flow_opened(true);
    std::vector<Held> held;
    held.swap(held_);
    follow(FlowDirection::to_server, s);
    for (Held& h : held) {
        if (phase_ != Phase::open) break;
        h.segment.payload = h.payload;
        if (stream(h.dir).behind(h.segment.seq, h.payload.size()) && !h.segment.has(TcpSegment::kFin) &&
            !h.segment.has(TcpSegment::kRst))
            continue;  // before the join point: not this mirror's business
        follow(h.dir, h.segment);
    }
}

void TcpConnectionTracker::hold(FlowDirection dir, const TcpSegment& s) {
    if (held_.size() == kMaxHeldSegments) held_.erase(held_.begin());
    Held h{dir, s, std::vector<std::uint8_t>(s.payload.begin(), s.payload.end())};
    h.segment.payload = {};
    held_.push_back(std::move(h));
}

void TcpConnectionTracker::follow(FlowDirection dir, const TcpSegment& s) {
    const int d = index(dir);
    const FlowDirection other = dir == FlowDirection::to_server ? FlowDirection::to_client : FlowDirection::to_server;
    TcpStreamReassembler& mine = dir == FlowDirection::to_server ? client_ : server_;
    TcpStreamReassembler& theirs = dir == FlowDirection::to_server ? server_ : client_;
    if (s.has(TcpSegment::kRst)) {
        phase_ = Phase::closed;
        sink_.flow_reset();
        return;
    }
    if (s.has(TcpSegment::kSyn)) {
        // The SYN-ACK says where the server's bytes start; a SYN again is a
        // retransmission.  Neither carries stream bytes here.
        if (dir == FlowDirection::to_client && !server_.started()) server_.start(s.seq + 1);
        return;
    }
    // The SYN-ACK was not captured: the client's acknowledgment says where
    // the server's bytes start.
    if (dir == FlowDirection::to_server && s.has(TcpSegment::kAck) && !server_.started()) server_.start(s.ack);
    if (s.has(TcpSegment::kAck)) {
        if (!lost_[index(other)] && theirs.acknowledged_hole(s.ack)) suspect(other, s.ack);
        theirs.acknowledged(s.ack);
    }
    const std::size_t carried = s.payload.size() + s.missing;
    if (!mine.started()) {
        if (carried > 0) lose(dir, StreamLoss::unplaced);  // bytes with no known place in the stream
    } else if (!lost_[d]) {
        if (!s.payload.empty() && mine.add(s.seq, s.payload) == TcpStreamReassembler::Added::overflow)
            lose(dir, StreamLoss::reassembly_full);
        if (!lost_[d] && s.missing > 0 &&
            !mine.behind(s.seq + static_cast<std::uint32_t>(s.payload.size()), s.missing))
            lose(dir, StreamLoss::truncated);
    }
    if (s.has(TcpSegment::kFin)) {
        fin_seen_[d] = true;
        mine.fin(s.seq + static_cast<std::uint32_t>(carried));
    }
    clear_filled_suspicions();
    check_ends();
    rejoin_after_loss();
}

void TcpConnectionTracker::suspect(FlowDirection dir, std::uint32_t ack) {
    const int d = index(dir);
    // The furthest acknowledgment: the bytes before it must all come.
    if (!suspected_[d] || static_cast<std::int32_t>(ack - suspected_ack_[d]) > 0) suspected_ack_[d] = ack;
    if (!suspected_[d]) suspected_age_[d] = 0;
    suspected_[d] = true;
}

void TcpConnectionTracker::clear_filled_suspicions() {
    for (const FlowDirection dir : {FlowDirection::to_server, FlowDirection::to_client}) {
        const int d = index(dir);
        if (suspected_[d] && (lost_[d] || !stream(dir).acknowledged_hole(suspected_ack_[d]))) suspected_[d] = false;
    }
}

void TcpConnectionTracker::age_suspected_losses() {
    if (phase_ != Phase::open) return;
    clear_filled_suspicions();
    for (const FlowDirection dir : {FlowDirection::to_server, FlowDirection::to_client}) {
        const int d = index(dir);
        if (!suspected_[d] || ++suspected_age_[d] < 2) continue;
        suspected_[d] = false;
        lose(dir, StreamLoss::acknowledged_unseen);
    }
    check_ends();
    rejoin_after_loss();
}

void TcpConnectionTracker::lose(FlowDirection dir, StreamLoss why) {
    lost_[index(dir)] = true;
    sink_.flow_lost(dir, why);
}

void TcpConnectionTracker::capture_dropped_while_silent() {
    if (client_.unacknowledged()) client_bytes_lost(StreamLoss::dropped_while_silent);
}

void TcpConnectionTracker::client_bytes_lost(StreamLoss why) {
    if (phase_ != Phase::open || lost_[index(FlowDirection::to_server)]) return;
    lose(FlowDirection::to_server, why);
    rejoin_after_loss();
}

// The client's stream has a hole: followed again from its next request, as a
// connection joined mid-stream, when requests can be recognised.
void TcpConnectionTracker::rejoin_after_loss() {
    if (phase_ != Phase::open || !lost_[index(FlowDirection::to_server)] || !request_start_) return;
    if (fin_seen_[index(FlowDirection::to_server)]) return;  // no request will come
    phase_ = Phase::joining;
    held_.clear();
}

void TcpConnectionTracker::check_ends() {
    for (const FlowDirection dir : {FlowDirection::to_server, FlowDirection::to_client}) {
        const int d = index(dir);
        if (ended_[d] || !((lost_[d] && fin_seen_[d]) || stream(dir).ended())) continue;
        ended_[d] = true;
        sink_.flow_ended(dir);
    }
    if (ended_[0] && ended_[1] && phase_ == Phase::open) phase_ = Phase::closed;
}

}  // namespace iprobe::proxy
