// TCP connections rebuilt from captured segments: how `iprobe mirror
// --capture` follows production's traffic without being in its path.
//
// A capture sees segments, not streams: out of order, retransmitted,
// overlapping, duplicated by the path, sequence numbers wrapping, a
// connection's start possibly missed (it was open before the capture began),
// and — when the capture's ring is full — segments the receiver got but the
// capture did not.  CaptureStart says where the capture's view has no gaps
// from.  TcpStreamReassembler turns one direction back into the
// byte stream the receiver read; TcpConnectionTracker follows both directions
// of a connection, joins connections already open at a request boundary, and
// proves capture loss from the receiver's own acknowledgments.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace iprobe::proxy {

// The TCP header fields reassembly needs, and the payload as captured.
struct TcpSegment {
    static constexpr std::uint8_t kFin = 0x01, kSyn = 0x02, kRst = 0x04, kAck = 0x10;
    std::uint32_t seq = 0;
    std::uint32_t ack = 0;
    std::uint8_t flags = 0;
    std::span<const std::uint8_t> payload;
    // Payload bytes the segment carried that the capture did not keep (snap
    // length): they follow `payload` in sequence space.
    std::size_t missing = 0;
    bool has(std::uint8_t flag) const { return (flags & flag) != 0; }
};

// One direction of a connection.  Sequence numbers are unwrapped into 64-bit
// stream positions around the next expected byte, so a stream may wrap the
// 32-bit space any number of times.  Every byte is delivered once, in order;
// bytes that arrive ahead of a gap wait (at most `max_pending` of them) until
// it is filled; where segments overlap, the bytes that came first are kept.
class TcpStreamReassembler {
public:
    using Deliver = std::function<void(std::span<const std::uint8_t>)>;

    TcpStreamReassembler(std::size_t max_pending, Deliver deliver);
    TcpStreamReassembler(const TcpStreamReassembler&) = delete;
    TcpStreamReassembler& operator=(const TcpStreamReassembler&) = delete;

    // The stream's first byte has sequence number `seq` (the SYN's + 1, or
    // where a mid-stream join starts); anything kept from before is dropped.
    void start(std::uint32_t seq);
    bool started() const { return started_; }

    enum class Added {
        delivered,   // some bytes were new and in order (and maybe released waiting ones)
        waiting,     // ahead of a gap: kept
        duplicate,   // every byte was delivered or waiting already (a retransmission)
        overflow,    // keeping it would pass max_pending: nothing kept, the stream cannot go on whole
    };
    Added add(std::uint32_t seq, std::span<const std::uint8_t> payload);
    // A FIN at sequence number `seq` (the byte after the segment's payload).
    void fin(std::uint32_t seq);
    bool fin_seen() const { return fin_at_ != 0; }
    // Every byte before the FIN has been delivered.
    bool ended() const { return fin_at_ != 0 && next_ == fin_at_; }
    // The receiver acknowledged every byte before `ack`.  True when some of
    // those bytes were never delivered here: the capture lost them, the
    // receiver did not.
    bool acknowledged_hole(std::uint32_t ack) const;
    // Whether a segment at `seq` of `length` bytes lies wholly before the next
    // byte expected (already delivered, or before the start).
    bool behind(std::uint32_t seq, std::size_t length) const;
    // The receiver's acknowledgment, as captured.
    void acknowledged(std::uint32_t ack);
    // Bytes (or the FIN) captured that no captured acknowledgment covers yet.
    bool unacknowledged() const { return started_ && seen_end_ > acked_; }

    std::uint64_t delivered() const { return started_ ? next_ - first_ : 0; }
    std::size_t pending() const { return pending_bytes_; }
    struct Counters {
        std::uint64_t out_of_order_segments = 0;  // arrived ahead of a gap
        std::uint64_t retransmitted_bytes = 0;    // arrived again after they were delivered
        std::uint64_t overlapping_bytes = 0;      // arrived again while waiting
        bool operator==(const Counters&) const = default;
    };
    const Counters& counters() const { return counters_; }

private:
    std::uint64_t position(std::uint32_t seq) const;
    void keep(std::uint64_t at, std::span<const std::uint8_t> bytes);
    void release();

    std::size_t max_pending_;
    Deliver deliver_;
    bool started_ = false;
    std::uint64_t first_ = 0, next_ = 0;  // stream positions; 0 is never one (see start())
    std::uint64_t fin_at_ = 0;            // position of the FIN, 0: none seen
    std::uint64_t seen_end_ = 0;          // end of the furthest segment (or FIN) captured
    std::uint64_t acked_ = 0;             // the furthest acknowledgment captured
    std::map<std::uint64_t, std::vector<std::uint8_t>> pending_;  // by position, never overlapping
    std::size_t pending_bytes_ = 0;
    Counters counters_;
};

// Where a capture's view of the wire starts to have no gaps.  libpcap attaches
// its BPF filter to a ring that is already taking packets, and while it swaps
// filters it rejects every packet for a moment (a reject-all filter while it
// drains the socket), which no drop count includes.  A connection seen on
// both sides of that moment shows bytes its receiver acknowledged and the
// capture never had: a loss production never had.  So the capture starts
// after it, at the first packet in the ring's order stamped after `from_us`
// (the packets' clock, read once the filter was in place and a margin for
// the kernel's stamping had passed): that packet and every one the ring
// holds after it passed the final filter.  The packets before it are set
// aside, the ones after it are the capture: a connection it finds open is
// joined, as one open before the capture began.
class CaptureStart {
public:
    explicit CaptureStart(std::int64_t from_us) : from_us_(from_us) {}
    // Whether the next packet in the ring's order, stamped `at_us`, is captured.
    bool admits(std::int64_t at_us) {
        if (!started_ && at_us > from_us_) started_ = true;
        if (!started_) ++set_aside_;
        return started_;
    }
    std::uint64_t set_aside() const { return set_aside_; }

private:
    std::int64_t from_us_;
    bool started_ = false;
    std::uint64_t set_aside_ = 0;
};

enum class FlowDirection : std::uint8_t { to_server = 0, to_client = 1 };

// Why a direction of a followed connection was given up: each is counted by
// its cause (the capture's `loss_causes`), so a loss is never put down to the
// wrong one.
enum class StreamLoss : std::uint8_t {
    unplaced,                  // bytes before the capture knew where the stream starts
    reassembly_full,           // more out-of-order bytes than the reassembly buffer holds
    truncated,                 // a packet cut short by the snap length
    acknowledged_unseen,       // the receiver acknowledged bytes the capture never saw
    dropped_while_silent,      // the kernel dropped packets; the server never acknowledged what was seen
    production_received_more,  // production's socket received more than the capture saw
};
inline constexpr std::size_t kStreamLossCauses = 6;
// The cause's name in stats (snake case) and its words for a log line.
const char* stream_loss_name(StreamLoss why);
const char* stream_loss_words(StreamLoss why);

// What a tracked connection tells its owner, in stream order.
class TcpFlowSink {
public:
    // The connection is followed from here: from its SYN, or joined
    // mid-stream at the start of a client request.
    virtual void flow_opened(bool mid_stream) = 0;
    virtual void flow_bytes(FlowDirection dir, std::span<const std::uint8_t> bytes) = 0;
    // The direction's FIN, every byte before it delivered.
    virtual void flow_ended(FlowDirection dir) = 0;
    virtual void flow_reset() = 0;
    // Bytes of this direction reached the receiver but not the capture (or
    // could not be kept): nothing more of it is delivered.
    virtual void flow_lost(FlowDirection dir, StreamLoss why) = 0;

protected:
    ~TcpFlowSink() = default;
};

// Both directions of one connection.  Followed from its SYN when the capture
// sees it; otherwise joined mid-stream at the first client segment that starts
// a request (`request_start`; none: never joined), the reply stream starting
// at what that segment acknowledges — exact for clients that wait for each
// reply before the next request.  After client bytes are lost the connection
// is joined again the same way, at its next request (the owner sees
// flow_lost, then flow_opened again).
class TcpConnectionTracker {
public:
    using RequestStart = bool (*)(std::span<const std::uint8_t>);
    enum class Phase { joining, open, unjoinable, closed };

    TcpConnectionTracker(std::size_t max_pending, RequestStart request_start, TcpFlowSink& sink);
    TcpConnectionTracker(const TcpConnectionTracker&) = delete;
    TcpConnectionTracker& operator=(const TcpConnectionTracker&) = delete;

    void segment(FlowDirection dir, const TcpSegment& s);
    // The capture lost packets (the kernel's count) and has heard nothing of
    // this connection since.  If client bytes it saw were still
    // unacknowledged, the server's acknowledgment (TCP sends one) was never
    // captured: the capture lost packets of this connection, so its client
    // stream is treated as lost.  A connection that was quiet stays followed:
    // should it have sent bytes the capture missed, its next segment shows the
    // hole; should it never speak again, what it sent in the drop goes
    // unnoticed but for the kernel's count.
    void capture_dropped_while_silent();
    // The client's stream lost bytes by other evidence (production's own
    // socket received more than was captured).
    void client_bytes_lost(StreamLoss why);
    // An acknowledgment of bytes the capture has not delivered is only a
    // suspicion at first: the kernel's capture ring is filled by every CPU,
    // so a segment may be handed over after the acknowledgment it caused.
    // The owner calls this periodically (every 100 ms); a hole still open at
    // the second call is a loss.
    void age_suspected_losses();

    Phase phase() const { return phase_; }
    bool lost(FlowDirection dir) const { return lost_[index(dir)]; }
    const TcpStreamReassembler& stream(FlowDirection dir) const { return dir == FlowDirection::to_server ? client_ : server_; }

    // Segments kept while looking for a request boundary to join at.
    static constexpr std::size_t kMaxHeldSegments = 64;

private:
    struct Held {
        FlowDirection dir;
        TcpSegment segment;
        std::vector<std::uint8_t> payload;
    };
    static int index(FlowDirection dir) { return static_cast<int>(dir); }
    void open_from_syn(const TcpSegment& s);
    void join(const TcpSegment& s);
    void hold(FlowDirection dir, const TcpSegment& s);
    void follow(FlowDirection dir, const TcpSegment& s);
    void lose(FlowDirection dir, StreamLoss why);
    void rejoin_after_loss();
    void check_ends();

    RequestStart request_start_;
    TcpFlowSink& sink_;
    Phase phase_ = Phase::joining;
    TcpStreamReassembler client_, server_;
    void suspect(FlowDirection dir, std::uint32_t ack);
    void clear_filled_suspicions();
    bool lost_[2] = {false, false};
    bool suspected_[2] = {false, false};
    std::uint32_t suspected_ack_[2] = {0, 0};
    int suspected_age_[2] = {0, 0};
    bool ended_[2] = {false, false};
    bool fin_seen_[2] = {false, false};
    std::vector<Held> held_;
};

}  // namespace iprobe::proxy
