// Capture mode's parts: the packet source (libpcap on a TPACKET_V3 ring), the
// table of TCP connections it follows, and the mirrored connection each
// client connection becomes.  Private to the proxy library.
#pragma once

#include <pcap/pcap.h>

#include <array>
#include <deque>
#include <unordered_map>

#include "iprobe/proxy/tcp_reassembly.h"
#include "mirror_impl.h"
#include "packet.h"
#include "socket_diag.h"

namespace iprobe::proxy::mirror_impl {

class Capture;
class CapturedConnection;

// --hold: a record of what a released connection was fed, written once every
// held connection's are known, in the order the capture saw them.
struct HeldRecord {
    std::uint64_t order = 0;
    std::shared_ptr<Recorder> recorder;
    RecordKind kind = RecordKind::data;
    std::uint32_t connection = 0;
    std::uint64_t t_ns = 0;
    std::string bytes;
};

// One followed connection: the tracker rebuilding both directions, and the
// mirrored connection it feeds once it is open (from its SYN, or joined).
class Flow final : public TcpFlowSink {
public:
    Flow(Capture& capture, const FlowKey& key);
    ~Flow();
    Flow(const Flow&) = delete;
    Flow& operator=(const Flow&) = delete;

    void segment(FlowDirection dir, const TcpSegment& s) { tracker_.segment(dir, s); }
    TcpConnectionTracker& tracker() { return tracker_; }
    const FlowKey& key() const { return key_; }
    // The mirrored connection is gone (retired by the proxy) or the flow is.
    void detach() { connection_ = nullptr; }
    CapturedConnection* connection() const { return connection_; }
    bool opened_from_syn() const { return from_syn_; }
    // Followed at all: opened from its SYN or joined.
    bool followed() const { return tracker_.stream(FlowDirection::to_server).started(); }
    // Its end was never captured (its ports are in use by a new connection).
    void ended_unseen();
    std::uint32_t syn_seq() const { return syn_seq_; }
    void set_syn_seq(std::uint32_t seq) { syn_seq_ = seq; }
    Clock::time_point closed_at{};  // when the tracker saw it end (for the table's expiry)
    const Clock::time_point first_seen = Clock::now();
    bool counted_unjoinable = false;
    std::int64_t last_packet_us = 0;  // the capture's stamp of its latest packet (realtime)
    bool counted_closed = false;

private:
    void flow_opened(bool mid_stream) override;
    void flow_bytes(FlowDirection dir, std::span<const std::uint8_t> bytes) override;
    void flow_ended(FlowDirection dir) override;
    void flow_reset() override;
    void flow_lost(FlowDirection dir, StreamLoss why) override;

    Capture& capture_;
    FlowKey key_;
    TcpConnectionTracker tracker_;
    CapturedConnection* connection_ = nullptr;
    bool from_syn_ = false;
    std::uint32_t syn_seq_ = 0;
};

// A client connection taken off the wire: no sockets of its own, only the
// debug leg, fed by its Flow.
class CapturedConnection final : public MirroredStream {
public:
    CapturedConnection(Proxy& px, Capture& capture, std::uint32_t id, Flow& flow, bool joined);
    ~CapturedConnection() override;

    void bytes(FlowDirection dir, std::span<const std::uint8_t> bytes);
    void ended(FlowDirection dir);
    void reset();
    void lost(FlowDirection dir, StreamLoss why);
    void detach() { flow_ = nullptr; }

    // --hold: the connection is kept, not yet fed to a copy, until release().
    bool held() const { return held_; }
    bool opened_after_checkpoint() const { return after_checkpoint_; }
    bool boundary_known() const { return boundary_.has_value() || !gap_.empty(); }
    // Where the clone's copy of this connection starts: production's socket
    // at the checkpoint (nullopt: it had none), from which the offset in the
    // client stream that production had read then follows.
    void checkpoint_reached(const std::optional<SocketDiag::Connection>& at_checkpoint);
    const FlowKey& key() const { return key_; }
    // Feeds the copies from the first request the checkpoint did not hold;
    // what it fed, for the recording, goes to `records`.
    void release(MirrorCommandReply& reply, std::vector<HeldRecord>& records);
    void fail_hold(const std::string& why) {
        if (gap_.empty()) gap_ = why;
    }

private:
    void close_source();
    void describe_source(MirrorStats::ConnectionStats& s) const override;
    void keep(int dir, std::span<const std::uint8_t> bytes);
    void skip_held_replies();
    void deliver_replies(bool record = true);
    void finish_source();
    void drop_arrivals(int dir, std::size_t bytes);
    void missed(MirrorCommandReply& reply, std::uint64_t requests, const std::string& why);

    Capture& capture_;
    Flow* flow_;
    std::string client_;
    FlowKey key_;
    bool joined_;
    bool ended_[2] = {false, false};
    bool lost_[2] = {false, false};
    // --hold
    bool held_ = false, after_checkpoint_ = false, closed_while_held_ = false;
    std::string kept_[2];                  // client bytes, production's replies, since the start
    bool kept_overflow_ = false;
    std::optional<std::uint64_t> boundary_;  // client bytes production had read at the checkpoint
    std::string gap_;                        // why the clone cannot have this connection whole
    std::string replies_lost_why_;           // why its replies are no longer compared
    std::uint64_t replies_to_skip_ = 0;      // production's replies to requests the checkpoint held
    std::vector<Message> skipped_requests_;  // for an HTTP reply framer's expect()
    struct Arrival {
        std::uint64_t order, t_ns;
        int dir;
        std::size_t size;
    };
    std::deque<Arrival> arrivals_;  // what kept_ holds, piece by piece, in capture order
};

struct CaptureCounters {
    std::uint64_t packets = 0, truncated_packets = 0, untracked_flows = 0;
    std::uint64_t from_start = 0, joined = 0, unjoinable = 0;
    std::uint64_t lost_connections = 0, lost_reply_connections = 0;
    std::array<std::uint64_t, kStreamLossCauses> loss_causes{};  // directions given up, by StreamLoss
    std::uint64_t checked_with_production = 0;  // connections compared with production's socket after drops
    std::uint64_t checkpoint_connections = 0, resumed = 0, skipped_requests = 0, missed_connections = 0,
                  missed_requests = 0;
    TcpStreamReassembler::Counters closed_streams;  // of flows no longer in the table
};

class Capture final : public Handler {
public:
    Capture(Proxy& px, const CaptureOptions& options);  // throws Error: no such interface, no permission
    ~Capture() override;

    void on_event(std::uint32_t events) override;
    // Periodic: the kernel's drop count, expiry of finished flows.
    void tick();
    MirrorStats::Capture snapshot() const;
    // Connections seen but not followed (waiting to join, or unjoinable):
    // listed with the open ones, never invisible.
    void unfollowed(std::vector<MirrorStats::ConnectionStats>& out, std::size_t max, Clock::time_point now) const;
    std::string description() const { return options_.str(); }

    Proxy& proxy() { return px_; }
    // --hold: production frozen now (MirrorCommand checkpoint); the clone is
    // ready (release).
    void checkpoint(MirrorCommandReply& reply);
    void release(MirrorCommandReply& reply);
    bool holding() const { return holding_; }
    bool checkpointed() const { return checkpoint_us_ != 0; }
    // The capture's stamp of the packet being handled, and the checkpoint's.
    std::int64_t packet_us() const { return packet_us_; }
    // The packet's stamp on the recording's clock (ns since the mirror
    // started): a request is stamped before production ran it, a reply
    // after, so a replay can tell which requests ran at the same time.
    std::uint64_t packet_ns() const {
        return packet_us_ > started_us_ ? static_cast<std::uint64_t>(packet_us_ - started_us_) * 1000 : 0;
    }
    std::int64_t checkpoint_us() const { return checkpoint_us_; }
    void connection_opened(CapturedConnection& c, const FlowKey& key);
    void connection_gone(CapturedConnection& c) { std::erase(held_, &c); }
    std::uint64_t next_arrival() { return ++arrivals_; }
    Protocol framing() const;
    const CaptureOptions& options() const { return options_; }
    CaptureCounters counters;
    RequestStartTest request_start() const { return request_start_; }
    void flow_closed(Flow& flow);

private:
    static void on_frame(u_char* self, const pcap_pkthdr* header, const u_char* bytes);
    void frame(const pcap_pkthdr& header, const std::uint8_t* bytes);
    void packet(const TcpPacket& p, std::int64_t at_us);
    std::string filter_expression() const;
    void forget(Flow& flow);
    void note_unjoinable(Flow& flow);
    void follow_open_connections();
    void drops_noticed();
    void check_with_production();

    Proxy& px_;
    CaptureOptions options_;
    RequestStartTest request_start_;
    std::unique_ptr<pcap_t, void (*)(pcap_t*)> pcap_;
    CaptureStart start_{INT64_MAX};  // set once the filter is in place
    int linktype_ = 0;
    std::string filter_;
    Watched w_;
    std::unordered_map<FlowKey, std::unique_ptr<Flow>, FlowKeyHash> flows_;
    std::deque<std::pair<Clock::time_point, FlowKey>> closed_;  // expiry order
    pcap_stat kernel_{};
    std::int64_t drops_noticed_us_ = 0;  // when the kernel's drop count last rose, until acted on
    Clock::time_point drained_at_{};     // the last time the ring had nothing more to read
    bool ring_drained_ = true;           // the last read of the ring reached its end
    // Production's sockets are in this network namespace: after drops, each
    // connection followed from its SYN is checked against what production's
    // socket received (first the socket is read, then, once the ring has
    // handed over all it held by then, the two are compared).
    SocketDiag diag_;
    bool production_here_ = false;
    struct Check {
        FlowKey key;
        const Flow* flow;
        std::optional<SocketDiag::Connection> production;
    };
    std::vector<Check> checks_;
    Clock::time_point checks_due_{};
    Clock::time_point last_expiry_{};
    // --hold
    void resolve(CapturedConnection& c, const FlowKey& key);
    bool holding_ = false;
    std::int64_t packet_us_ = 0, checkpoint_us_ = 0;
    std::int64_t started_us_ = 0;  // the mirror's start, on the packets' clock
    std::unordered_map<FlowKey, SocketDiag::Connection, FlowKeyHash> at_checkpoint_;
    std::vector<CapturedConnection*> held_;
    std::uint64_t arrivals_ = 0;
};

}  // namespace iprobe::proxy::mirror_impl
