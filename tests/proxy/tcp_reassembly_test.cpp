// TcpStreamReassembler and TcpConnectionTracker on synthetic segments: every
// order, overlap and wrap a capture can show, checked byte for byte.  The same
// code on real traffic: capture_redis_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "iprobe/proxy/framing.h"
#include "iprobe/proxy/tcp_reassembly.h"

using namespace iprobe::proxy;

namespace {

std::span<const std::uint8_t> bytes(const std::string& s) {
    return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

std::string pattern(std::size_t n, unsigned seed = 1) {
    std::mt19937 rng(seed);
    std::string s(n, '\0');
    for (auto& c : s) c = static_cast<char>('a' + rng() % 26);
    return s;
}

struct Collected {
    std::string out;
    int deliveries = 0;
    TcpStreamReassembler stream;
    explicit Collected(std::size_t max_pending = 1 << 20)
        : stream(max_pending, [this](std::span<const std::uint8_t> b) {
              out.append(reinterpret_cast<const char*>(b.data()), b.size());
              ++deliveries;
          }) {}
};

using Added = TcpStreamReassembler::Added;

}  // namespace

TEST(TcpStreamReassembler, InOrderBytesAreDeliveredAtOnce) {
    Collected c;
    c.stream.start(1000);
    EXPECT_EQ(c.stream.add(1000, bytes("hello ")), Added::delivered);
    EXPECT_EQ(c.stream.add(1006, bytes("world")), Added::delivered);
    EXPECT_EQ(c.out, "hello world");
    EXPECT_EQ(c.deliveries, 2);
    EXPECT_EQ(c.stream.delivered(), 11u);
    EXPECT_EQ(c.stream.pending(), 0u);
}

TEST(TcpStreamReassembler, BytesAfterAGapWaitUntilItIsFilled) {
    Collected c;
    c.stream.start(1);
    EXPECT_EQ(c.stream.add(11, bytes("KLMNO")), Added::waiting);
    EXPECT_EQ(c.stream.add(6, bytes("FGHIJ")), Added::waiting);
    EXPECT_EQ(c.out, "");
    EXPECT_EQ(c.stream.pending(), 10u);
    EXPECT_EQ(c.stream.add(1, bytes("ABCDE")), Added::delivered);
    EXPECT_EQ(c.out, "ABCDEFGHIJKLMNO");
    EXPECT_EQ(c.stream.pending(), 0u);
    EXPECT_EQ(c.stream.counters().out_of_order_segments, 2u);
}

TEST(TcpStreamReassembler, RetransmissionsAndOverlapsDeliverEachByteOnce) {
    Collected c;
    c.stream.start(100);
    c.stream.add(100, bytes("0123456789"));
    EXPECT_EQ(c.stream.add(100, bytes("0123456789")), Added::duplicate);  // retransmitted whole
    EXPECT_EQ(c.stream.add(105, bytes("56789abc")), Added::delivered);    // overlaps the delivered end
    EXPECT_EQ(c.stream.add(120, bytes("klmnop")), Added::waiting);
    EXPECT_EQ(c.stream.add(118, bytes("ijklm")), Added::waiting);         // overlaps a waiting segment's start
    EXPECT_EQ(c.stream.add(121, bytes("lmn")), Added::duplicate);         // inside a waiting segment
    EXPECT_EQ(c.stream.add(113, bytes("defghijklmnopq")), Added::delivered);  // covers them all and more
    EXPECT_EQ(c.out, "0123456789abcdefghijklmnopq");
    const auto& k = c.stream.counters();
    EXPECT_EQ(k.retransmitted_bytes, 10u + 5u);
    EXPECT_EQ(k.overlapping_bytes, 3u + 3u + 8u);
    EXPECT_EQ(c.stream.pending(), 0u);
}

TEST(TcpStreamReassembler, SequenceNumbersWrapAroundZero) {
    Collected c;
    const std::string data = pattern(3000);
    const std::uint32_t isn = 0xfffffa00u;  // 1536 bytes before the wrap
    c.stream.start(isn);
    // Second half first (across the wrap), then the first.
    EXPECT_EQ(c.stream.add(isn + 1500, bytes(data.substr(1500))), Added::waiting);
    EXPECT_EQ(c.stream.add(isn, bytes(data.substr(0, 1500))), Added::delivered);
    EXPECT_EQ(c.out, data);
    c.stream.fin(isn + 3000);
    EXPECT_TRUE(c.stream.ended());
    EXPECT_FALSE(c.stream.acknowledged_hole(isn + 3001));
    EXPECT_TRUE(c.stream.acknowledged_hole(isn + 3002));
}

TEST(TcpStreamReassembler, ManyWrapsOfTheSequenceSpace) {
    std::uint64_t total = 0;
    std::string last;
    TcpStreamReassembler stream(1 << 20, [&](std::span<const std::uint8_t> b) {
        total += b.size();
        last.assign(reinterpret_cast<const char*>(b.data()), b.size());
    });
    stream.start(0x80000000u);
    const std::string chunk = pattern(1 << 20, 7);
    std::uint32_t seq = 0x80000000u;
    for (int i = 0; i < 10000; ++i) {  // 10 GiB: two and a half turns of 2^32
        ASSERT_EQ(stream.add(seq, bytes(chunk.substr(0, 16))), Added::delivered) << i;
        ASSERT_EQ(stream.add(seq + 16, bytes(chunk)), Added::delivered) << i;
        seq += static_cast<std::uint32_t>(chunk.size() + 16);
    }
    EXPECT_EQ(stream.delivered(), 10000ull * ((1 << 20) + 16));
    EXPECT_EQ(total, stream.delivered());
    EXPECT_EQ(stream.add(seq - 10, bytes(chunk.substr(0, 20))), Added::delivered);
    EXPECT_EQ(last, chunk.substr(10, 10));
    EXPECT_EQ(stream.counters().retransmitted_bytes, 10u);
}

TEST(TcpStreamReassembler, WaitingBytesPastTheLimitAreAnOverflowAndNothingIsKept) {
    Collected c(100);
    c.stream.start(0);
    EXPECT_EQ(c.stream.add(10, bytes(std::string(60, 'x'))), Added::waiting);
    EXPECT_EQ(c.stream.add(80, bytes(std::string(50, 'y'))), Added::overflow);
    EXPECT_EQ(c.stream.pending(), 60u);
    EXPECT_EQ(c.stream.add(0, bytes(std::string(10, 'w'))), Added::delivered);
    EXPECT_EQ(c.out, std::string(10, 'w') + std::string(60, 'x'));
}

TEST(TcpStreamReassembler, FinEndsTheStreamOnceEveryByteBeforeItArrived) {
    Collected c;
    c.stream.start(0);
    c.stream.add(5, bytes("world"));
    c.stream.fin(10);
    EXPECT_TRUE(c.stream.fin_seen());
    EXPECT_FALSE(c.stream.ended());
    c.stream.add(0, bytes("hello"));
    EXPECT_TRUE(c.stream.ended());
    EXPECT_EQ(c.out, "helloworld");
}

TEST(TcpStreamReassembler, AnAcknowledgmentPastTheDeliveredBytesProvesAHole) {
    Collected c;
    c.stream.start(500);
    c.stream.add(500, bytes("abc"));
    EXPECT_FALSE(c.stream.acknowledged_hole(500));
    EXPECT_FALSE(c.stream.acknowledged_hole(503));
    c.stream.add(510, bytes("xyz"));  // 503..510 never captured
    EXPECT_FALSE(c.stream.acknowledged_hole(503));
    EXPECT_TRUE(c.stream.acknowledged_hole(513));
    EXPECT_TRUE(c.stream.acknowledged_hole(504));
    EXPECT_FALSE(c.stream.acknowledged_hole(400));  // an old acknowledgment
}

// Random streams cut at random points, segments shuffled within a window,
// duplicated and re-cut (overlaps): the output is the input, every time.
TEST(TcpStreamReassembler, AnyOrderAnyOverlapGivesTheStreamBack) {
    for (unsigned seed = 1; seed <= 300; ++seed) {
        std::mt19937 rng(seed);
        const std::string data = pattern(20000 + rng() % 20000, seed);
        const std::uint32_t isn = static_cast<std::uint32_t>(rng());
        struct Seg {
            std::size_t at, len;
        };
        std::vector<Seg> segs;
        for (std::size_t at = 0; at < data.size();) {
            const std::size_t len = std::min<std::size_t>(1 + rng() % 1500, data.size() - at);
            segs.push_back({at, len});
            at += len;
        }
        const std::size_t originals = segs.size();
        for (std::size_t i = 0; i < originals / 5; ++i) {  // retransmissions, some re-cut
            const Seg s = segs[rng() % originals];
            const std::size_t from = s.at + rng() % s.len;
            segs.push_back({from, std::min<std::size_t>(1 + rng() % 3000, data.size() - from)});
        }
        for (std::size_t i = 0; i < segs.size(); ++i)  // displacement within a window of 16
            std::swap(segs[i], segs[std::min(segs.size() - 1, i + rng() % 16)]);
        Collected c;
        c.stream.start(isn);
        for (const Seg& s : segs)
            ASSERT_NE(c.stream.add(isn + static_cast<std::uint32_t>(s.at), bytes(data.substr(s.at, s.len))),
                      Added::overflow);
        ASSERT_EQ(c.out, data) << "seed " << seed;
        ASSERT_EQ(c.stream.pending(), 0u) << "seed " << seed;
    }
}

namespace {

// Records what a tracked connection reports, in order.
struct Events final : TcpFlowSink {
    std::vector<std::string> log;
    std::string to_server, to_client;
    void flow_opened(bool mid_stream) override { log.push_back(mid_stream ? "joined" : "opened"); }
    void flow_bytes(FlowDirection dir, std::span<const std::uint8_t> b) override {
        (dir == FlowDirection::to_server ? to_server : to_client).append(reinterpret_cast<const char*>(b.data()), b.size());
    }
    void flow_ended(FlowDirection dir) override { log.push_back(dir == FlowDirection::to_server ? "client end" : "server end"); }
    void flow_reset() override { log.push_back("reset"); }
    void flow_lost(FlowDirection dir, StreamLoss why) override {
        log.push_back(std::string(dir == FlowDirection::to_server ? "client lost: " : "server lost: ") +
                      stream_loss_name(why));
    }
};

constexpr auto C = FlowDirection::to_server;
constexpr auto S = FlowDirection::to_client;

TcpSegment seg(std::uint32_t seq, std::uint32_t ack, std::uint8_t flags, const std::string& payload = {}) {
    TcpSegment s;
    s.seq = seq;
    s.ack = ack;
    s.flags = flags;
    s.payload = bytes(payload);
    return s;
}

constexpr std::uint8_t kAck = TcpSegment::kAck, kSyn = TcpSegment::kSyn, kFin = TcpSegment::kFin,
                       kRst = TcpSegment::kRst;

const std::string kSet = "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n";
const std::string kGet = "*2\r\n$3\r\nGET\r\n$1\r\nk\r\n";

}  // namespace

TEST(TcpConnectionTracker, FromTheSynToBothFins) {
    Events e;
    TcpConnectionTracker t(1 << 20, request_start_test(Protocol::resp), e);
    t.segment(C, seg(100, 0, kSyn));
    t.segment(S, seg(7000, 101, kSyn | kAck));
    t.segment(C, seg(101, 7001, kAck));
    t.segment(C, seg(101, 7001, kAck, kSet));
    t.segment(S, seg(7001, 101 + kSet.size(), kAck, "+OK\r\n"));
    t.segment(C, seg(101 + kSet.size(), 7006, kAck | kFin));
    EXPECT_EQ(t.phase(), TcpConnectionTracker::Phase::open);
    t.segment(S, seg(7006, 102 + kSet.size(), kAck | kFin));
    EXPECT_EQ(t.phase(), TcpConnectionTracker::Phase::closed);
    EXPECT_EQ(e.to_server, kSet);
    EXPECT_EQ(e.to_client, "+OK\r\n");
    EXPECT_EQ(e.log, (std::vector<std::string>{"opened", "client end", "server end"}));
}

TEST(TcpConnectionTracker, SynAckNotCapturedTheClientsAckSaysWhereRepliesStart) {
    Events e;
    TcpConnectionTracker t(1 << 20, nullptr, e);
    t.segment(C, seg(100, 0, kSyn));
    t.segment(C, seg(101, 7001, kAck, kGet));
    t.segment(S, seg(7001, 101 + kGet.size(), kAck, "$1\r\nv\r\n"));
    EXPECT_EQ(e.to_server, kGet);
    EXPECT_EQ(e.to_client, "$1\r\nv\r\n");
    EXPECT_EQ(e.log, (std::vector<std::string>{"opened"}));
}

TEST(TcpConnectionTracker, AConnectionAlreadyOpenIsJoinedAtARequestStart) {
    Events e;
    TcpConnectionTracker t(1 << 20, request_start_test(Protocol::resp), e);
    // The middle of a value, then a reply: no request starts here.
    t.segment(C, seg(5000, 9000, kAck, "ue-of-an-earlier-SET\r\n"));
    t.segment(S, seg(9000, 5022, kAck, "+OK\r\n"));
    EXPECT_EQ(t.phase(), TcpConnectionTracker::Phase::joining);
    // The next request's second segment overtakes its first.
    const std::uint32_t at = 5022;
    t.segment(C, seg(at + 10, 9005, kAck, kSet.substr(10)));
    EXPECT_EQ(t.phase(), TcpConnectionTracker::Phase::joining);
    t.segment(C, seg(at, 9005, kAck, kSet.substr(0, 10)));
    EXPECT_EQ(t.phase(), TcpConnectionTracker::Phase::open);
    t.segment(S, seg(9005, at + kSet.size(), kAck, "+OK\r\n"));
    EXPECT_EQ(e.to_server, kSet);
    EXPECT_EQ(e.to_client, "+OK\r\n");
    EXPECT_EQ(e.log, (std::vector<std::string>{"joined"}));
}

TEST(TcpConnectionTracker, WithoutARequestMarkAConnectionAlreadyOpenIsNotFollowed) {
    Events e;
    TcpConnectionTracker t(1 << 20, nullptr, e);
    t.segment(C, seg(5000, 9000, kAck, kSet));
    EXPECT_EQ(t.phase(), TcpConnectionTracker::Phase::unjoinable);
    t.segment(C, seg(5000 + kSet.size(), 9000, kAck | kFin));
    t.segment(S, seg(9000, 5001 + kSet.size(), kAck | kFin));
    EXPECT_EQ(t.phase(), TcpConnectionTracker::Phase::closed);
    EXPECT_TRUE(e.log.empty());
    EXPECT_TRUE(e.to_server.empty());
}

TEST(TcpConnectionTracker, BytesTheServerAcknowledgedButTheCaptureMissedAreALoss) {
    Events e;
    TcpConnectionTracker t(1 << 20, nullptr, e);
    t.segment(C, seg(100, 0, kSyn));
    t.segment(S, seg(7000, 101, kSyn | kAck));
    t.segment(C, seg(101, 7001, kAck, kSet));
    // kGet never captured; the next request is, and then the server's ACK of both.
    const std::uint32_t third = 101 + static_cast<std::uint32_t>(kSet.size() + kGet.size());
    t.segment(C, seg(third, 7001, kAck, kGet));
    EXPECT_EQ(e.log.size(), 1u);  // waiting: it may be a reordering
    t.segment(S, seg(7001, third + static_cast<std::uint32_t>(kGet.size()), kAck, "+OK\r\n"));
    // Suspected (the capture may hand the segment over late), lost at the
    // second look.
    t.age_suspected_losses();
    EXPECT_EQ(e.log.size(), 1u);
    t.age_suspected_losses();
    EXPECT_EQ(e.log, (std::vector<std::string>{"opened", "client lost: acknowledged_unseen"}));
    EXPECT_TRUE(t.lost(C));
    EXPECT_FALSE(t.lost(S));
    EXPECT_EQ(e.to_server, kSet);  // a whole prefix, never the bytes after the hole
    t.segment(C, seg(third + 100, 7006, kAck, kGet));
    EXPECT_EQ(e.to_server, kSet);
    EXPECT_EQ(e.to_client, "+OK\r\n");  // the other direction goes on
}

// The capture's ring is filled by every CPU: the server's acknowledgment may
// be handed over before the segment it acknowledges.  Not a loss.
TEST(TcpConnectionTracker, AnAcknowledgmentCapturedBeforeItsSegmentIsNoLoss) {
    Events e;
    TcpConnectionTracker t(1 << 20, nullptr, e);
    t.segment(C, seg(100, 0, kSyn));
    t.segment(S, seg(7000, 101, kSyn | kAck));
    t.segment(C, seg(101, 7001, kAck, kSet));
    const std::uint32_t after = 101 + static_cast<std::uint32_t>(kSet.size() + kGet.size());
    t.segment(S, seg(7001, after, kAck, "+OK\r\n"));
    t.age_suspected_losses();
    t.segment(C, seg(101 + static_cast<std::uint32_t>(kSet.size()), 7001, kAck, kGet));
    t.age_suspected_losses();
    t.age_suspected_losses();
    EXPECT_FALSE(t.lost(C));
    EXPECT_EQ(e.to_server, kSet + kGet);
    EXPECT_EQ(e.log, (std::vector<std::string>{"opened"}));
}

TEST(TcpConnectionTracker, APayloadCutShortByTheSnapLengthIsALoss) {
    Events e;
    TcpConnectionTracker t(1 << 20, nullptr, e);
    t.segment(C, seg(100, 0, kSyn));
    TcpSegment cut = seg(101, 7001, kAck, kSet.substr(0, 8));
    cut.missing = kSet.size() - 8;
    t.segment(C, cut);
    EXPECT_EQ(e.log, (std::vector<std::string>{"opened", "client lost: truncated"}));
    EXPECT_EQ(e.to_server, kSet.substr(0, 8));
}

TEST(TcpConnectionTracker, ResetEndsTheConnection) {
    Events e;
    TcpConnectionTracker t(1 << 20, nullptr, e);
    t.segment(C, seg(100, 0, kSyn));
    t.segment(C, seg(101, 7001, kAck, kGet));
    t.segment(S, seg(7001, 0, kRst));
    EXPECT_EQ(t.phase(), TcpConnectionTracker::Phase::closed);
    EXPECT_EQ(e.log, (std::vector<std::string>{"opened", "reset"}));
    t.segment(C, seg(101 + kGet.size(), 7001, kAck, kGet));
    EXPECT_EQ(e.to_server, kGet);
}

TEST(CaptureStart, TheCaptureStartsAtTheFirstPacketStampedAfterTheFilterAndStaysStarted) {
    CaptureStart start(1000);
    EXPECT_FALSE(start.admits(900));
    EXPECT_FALSE(start.admits(1000));
    EXPECT_TRUE(start.admits(1001));
    // Later in the ring's order, stamped earlier (another CPU's packet): the
    // capture has started, nothing after its start is set aside.
    EXPECT_TRUE(start.admits(999));
    EXPECT_TRUE(start.admits(1002));
    EXPECT_EQ(start.set_aside(), 2u);
}

namespace {

// One connection's segments as the capture's ring held them at the start of
// `iprobe debug --capture` (LauncherDebugCapture.WritesAcrossTheCheckpoint-
// AllReachTheClone, a client writing SET w1:NNNN v as fast as redis answers,
// open before the session): stamp, direction, sequence and acknowledgment
// numbers, payload length.  Between 282554 and 282606 libpcap swapped its
// filters and the ring took nothing: two requests and a reply of this
// connection reached redis but not the capture.
struct Captured {
    std::int64_t at_us;
    FlowDirection dir;
    std::uint32_t seq, ack, length;
};
const std::vector<Captured> kAcrossTheFilterSwap = {
    {282392, S, 2954890063u, 1651128134u, 5},  {282420, C, 1651128134u, 2954890068u, 33},
    {282430, S, 2954890068u, 1651128167u, 5},  {282444, C, 1651128167u, 2954890073u, 33},
    {282465, S, 2954890073u, 1651128200u, 5},  {282475, C, 1651128200u, 2954890078u, 33},
    {282482, S, 2954890078u, 1651128233u, 5},  {282490, C, 1651128233u, 2954890083u, 33},
    {282508, S, 2954890083u, 1651128266u, 5},  {282519, C, 1651128266u, 2954890088u, 33},
    {282527, S, 2954890088u, 1651128299u, 5},  {282535, C, 1651128299u, 2954890093u, 33},
    {282554, S, 2954890093u, 1651128332u, 5},
    // The filter swap: [C 1651128332, S 2954890098, C 1651128365] never captured.
    {282606, S, 2954890103u, 1651128398u, 5},  {282617, C, 1651128398u, 2954890108u, 33},
    {282623, S, 2954890108u, 1651128431u, 5},  {282631, C, 1651128431u, 2954890113u, 33},
    {282649, S, 2954890113u, 1651128464u, 5},  {282659, C, 1651128464u, 2954890118u, 33},
    {282667, S, 2954890118u, 1651128497u, 5},  {282675, C, 1651128497u, 2954890123u, 33},
    {282692, S, 2954890123u, 1651128530u, 5},
};
constexpr std::int64_t kFilterSwapEnd = 282580;

// The request starting at client sequence number `seq`: 33 bytes, its key
// telling requests apart.
std::string request_at(std::uint32_t seq) {
    const std::string key = "w1:" + std::to_string(seq % 10000 + 10000).substr(1);
    return "*3\r\n$3\r\nSET\r\n$" + std::to_string(key.size()) + "\r\n" + key + "\r\n$1\r\nv\r\n";
}

// Feeds `segments` through a capture started at `start` (all of them, when
// none) to a tracker, aging suspicions as the capture's 100 ms tick would
// with the ring read to its end.
struct Replayed {
    Events events;
    TcpConnectionTracker tracker{1 << 20, request_start_test(Protocol::resp), events};
    std::string requests_after_start;  // the client bytes a capture from `start` holds whole
};
void replay(const std::vector<Captured>& segments, std::optional<CaptureStart> start, Replayed& r) {
    for (const Captured& c : segments) {
        if (start && !start->admits(c.at_us)) continue;
        const std::string payload = c.dir == C ? request_at(c.seq) : std::string("+OK\r\n");
        ASSERT_EQ(payload.size(), c.length);
        r.tracker.segment(c.dir, seg(c.seq, c.ack, kAck, payload));
        if (c.dir == C) r.requests_after_start += payload;
    }
    r.tracker.age_suspected_losses();
    r.tracker.age_suspected_losses();
}

}  // namespace

// What the capture wrongly declared lost: a connection joined from packets
// the ring took before libpcap's filter swap shows the bytes the swap hid as
// acknowledged and never captured.  A capture that starts after the swap
// joins it at its next request and has every byte from there.
TEST(CaptureStart, AConnectionSeenAcrossTheFilterSwapIsJoinedAfterItWithNothingLost) {
    Replayed whole;  // every packet the ring held, as before the fix
    replay(kAcrossTheFilterSwap, std::nullopt, whole);
    EXPECT_EQ(whole.events.log, (std::vector<std::string>{"joined", "client lost: acknowledged_unseen", "server lost: acknowledged_unseen"}));

    Replayed after;
    CaptureStart start(kFilterSwapEnd);
    replay(kAcrossTheFilterSwap, start, after);
    EXPECT_EQ(after.events.log, (std::vector<std::string>{"joined"}));
    EXPECT_FALSE(after.tracker.lost(C));
    EXPECT_FALSE(after.tracker.lost(S));
    // Joined at the first request after the swap: every request from there, and
    // the replies to them (the one before it is production's reply to a
    // request the capture never had whole).
    EXPECT_EQ(after.events.to_server, after.requests_after_start);
    EXPECT_EQ(after.events.to_server.size(), 4u * 33);
    EXPECT_EQ(after.events.to_client, "+OK\r\n+OK\r\n+OK\r\n+OK\r\n");
}

// The same hole after the capture's start is a loss the capture made: said
// (flow_lost, which the mirror counts in lost_connections and
// lost_reply_connections) and the connection
// joined again at its next request, never fed a stream with a hole.
TEST(CaptureStart, BytesMissedAfterTheCapturesStartAreStillALoss) {
    Replayed r;
    CaptureStart start(282000);  // before every packet: the hole is the capture's own
    replay(kAcrossTheFilterSwap, start, r);
    EXPECT_EQ(start.set_aside(), 0u);
    EXPECT_TRUE(r.tracker.lost(C));
    EXPECT_TRUE(r.tracker.lost(S));  // the reply in the hole too
    EXPECT_EQ(r.events.log, (std::vector<std::string>{"joined", "client lost: acknowledged_unseen", "server lost: acknowledged_unseen"}));
    // The requests up to the hole, whole; none of those after it on this copy.
    EXPECT_EQ(r.events.to_server.size(), 6u * 33);
    EXPECT_EQ(r.events.to_server, r.requests_after_start.substr(0, 6 * 33));
    // Followed again from its next request, as a new mirrored connection.
    r.tracker.segment(C, seg(1651128530u, 2954890128u, kAck, request_at(1651128530u)));
    EXPECT_EQ(r.events.log, (std::vector<std::string>{"joined", "client lost: acknowledged_unseen", "server lost: acknowledged_unseen", "joined"}));
}

TEST(ProxyRequestStart, RecognisesRespAndHttpRequestsOnly) {
    const auto resp = request_start_test(Protocol::resp);
    const auto http = request_start_test(Protocol::http);
    ASSERT_TRUE(resp && http);
    EXPECT_TRUE(resp(bytes(kSet)));
    EXPECT_TRUE(resp(bytes("*12\r\n$4\r\nMSET\r\n")));
    EXPECT_FALSE(resp(bytes("+OK\r\n")));
    EXPECT_FALSE(resp(bytes("*3\r\n:1\r\n")));
    EXPECT_FALSE(resp(bytes("value-bytes\r\n")));
    EXPECT_FALSE(resp(bytes("*0\r\n")));
    // Inline commands: whole lines, each a command name and its arguments.
    EXPECT_TRUE(resp(bytes("PING\r\n")));
    EXPECT_TRUE(resp(bytes("SET k v\r\n")));
    EXPECT_TRUE(resp(bytes("ping\n")));
    EXPECT_TRUE(resp(bytes("PING\r\nINCR n\r\n")));
    EXPECT_FALSE(resp(bytes("PING")));                 // the line is not whole
    EXPECT_FALSE(resp(bytes("PING\r\n*1\r\n$4\r\n")));  // a multibulk tail cut off
    EXPECT_FALSE(resp(bytes("SET k \x01v\r\n")));
    EXPECT_FALSE(resp(bytes("12345\r\n")));
    EXPECT_TRUE(http(bytes("GET /index.html HTTP/1.1\r\nHost: x\r\n\r\n")));
    EXPECT_TRUE(http(bytes("POST /api HTTP/1.0\r\n")));
    EXPECT_FALSE(http(bytes("HTTP/1.1 200 OK\r\n")));
    EXPECT_FALSE(http(bytes("get / HTTP/1.1\r\n")));
    EXPECT_FALSE(http(bytes("GET / HTTP/1.1")));  // the line is not whole
    EXPECT_EQ(request_start_test(Protocol::stream), nullptr);
}
