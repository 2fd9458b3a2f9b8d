// Framers, the bounded debug buffer, the stream comparer and the rule file,
// without sockets.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "iprobe/proxy/address.h"
#include "iprobe/proxy/debug_buffer.h"
#include "iprobe/proxy/framing.h"
#include "iprobe/proxy/mirror.h"
#include "iprobe/proxy/stats.h"
#include "iprobe/support/error.h"
#include "iprobe/proxy/stream_compare.h"

using namespace iprobe;
using namespace iprobe::proxy;

namespace {

std::span<const std::uint8_t> bytes(const std::string& s) {
    return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

// Feeds `text` in pieces of `step` bytes (1 = every split point).
std::vector<Message> frame(Protocol p, Role role, const std::string& text, std::size_t step,
                           const DivergenceRules& rules = DivergenceRules::defaults(),
                           const std::vector<Message>& requests = {}) {
    auto f = Framer::create(p, role, rules);
    for (const auto& r : requests) f->expect(r);
    std::vector<Message> out;
    for (std::size_t i = 0; i < text.size(); i += step) f->feed(bytes(text.substr(i, step)), out);
    f->finish(out);
    EXPECT_FALSE(f->failed()) << f->error();
    return out;
}

const std::string kRespRequests =
    "*3\r\n$3\r\nSET\r\n$6\r\nuser:1\r\n$5\r\nalice\r\n"
    "PING\r\n"
    "*2\r\n$3\r\nGET\r\n$6\r\nuser:1\r\n"
    "*1\r\n$4\r\nQUIT\r\n";

const std::string kRespReplies =
    "+OK\r\n"
    "+PONG\r\n"
    "$5\r\nalice\r\n"
    "*3\r\n$1\r\na\r\n*2\r\n:1\r\n$-1\r\n%1\r\n+k\r\n_\r\n"  // nested array with a RESP3 map
    "-ERR unknown\r\n"
    "$0\r\n\r\n";

}  // namespace

TEST(ProxyRespFramer, RequestsAtEverySplitPoint) {
    for (std::size_t step : {1u, 2u, 3u, 7u, 1000u}) {
        const auto m = frame(Protocol::resp, Role::request, kRespRequests, step);
        ASSERT_EQ(m.size(), 4u) << "step " << step;
        EXPECT_EQ(m[0].verb, "SET");
        EXPECT_EQ(m[0].summary, "SET user:1 alice");
        EXPECT_EQ(m[1].verb, "PING");
        EXPECT_EQ(m[1].summary, "PING");
        EXPECT_EQ(m[2].summary, "GET user:1");
        EXPECT_EQ(m[3].verb, "QUIT");
        std::size_t total = 0;
        for (const auto& x : m) total += x.size;
        EXPECT_EQ(total, kRespRequests.size());
    }
}

TEST(ProxyRespFramer, RepliesIncludingNestedAndResp3) {
    const auto whole = frame(Protocol::resp, Role::response, kRespReplies, 10000);
    ASSERT_EQ(whole.size(), 6u);
    for (std::size_t step : {1u, 4u, 5u}) {
        const auto m = frame(Protocol::resp, Role::response, kRespReplies, step);
        ASSERT_EQ(m.size(), whole.size());
        for (std::size_t i = 0; i < m.size(); ++i) EXPECT_EQ(m[i].hash, whole[i].hash) << i;
    }
    EXPECT_EQ(whole[2].excerpt, "$5\r\nalice\r\n");
    EXPECT_NE(whole[0].hash, whole[1].hash);
}

TEST(ProxyRespFramer, SameValueSameHashDifferentValueDifferentHash) {
    const auto a = frame(Protocol::resp, Role::response, "$5\r\nalice\r\n", 3);
    const auto b = frame(Protocol::resp, Role::response, "$5\r\nalice\r\n", 1);
    const auto c = frame(Protocol::resp, Role::response, "$5\r\nalicf\r\n", 1);
    EXPECT_EQ(a[0].hash, b[0].hash);
    EXPECT_NE(a[0].hash, c[0].hash);
}

TEST(ProxyRespFramer, BigBulkStringIsOneMessage) {
    const std::string value(1 << 20, 'x');
    const std::string reply = "$" + std::to_string(value.size()) + "\r\n" + value + "\r\n:7\r\n";
    const auto m = frame(Protocol::resp, Role::response, reply, 4096);
    ASSERT_EQ(m.size(), 2u);
    EXPECT_EQ(m[0].size, value.size() + 12);  // "$1048576\r\n" + value + "\r\n"
}

TEST(ProxyRespFramer, GarbageStopsTheFramer) {
    auto f = Framer::create(Protocol::resp, Role::response, DivergenceRules::defaults());
    std::vector<Message> out;
    f->feed(bytes("+OK\r\n?what\r\n+OK\r\n"), out);
    EXPECT_TRUE(f->failed());
    EXPECT_EQ(out.size(), 1u);
}

// Lengths no peer could send stop the framer instead of overflowing its
// counters (found by fuzzing: a RESP3 attribute of 8198552921648689608).
TEST(ProxyRespFramer, LengthsBeyondAnyWireStopTheFramer) {
    for (const std::string line : {"|8198552921648689608\r\n", "%4611686018427387904\r\n", "*2147483648\r\n",
                                    "$9223372036854775807\r\n"}) {
        auto f = Framer::create(Protocol::resp, Role::response, DivergenceRules::defaults());
        std::vector<Message> out;
        f->feed(bytes("+OK\r\n" + line + "+OK\r\n"), out);
        EXPECT_TRUE(f->failed()) << line;
        EXPECT_NE(f->error().find("out of range"), std::string::npos) << f->error();
        EXPECT_EQ(out.size(), 1u) << line;
    }
    // The largest aggregate Redis itself accepts still frames.
    EXPECT_EQ(frame(Protocol::resp, Role::response, "*0\r\n*2147483647\r\n", 64).size(), 1u);
}

TEST(ProxyHttpFramer, ContentLengthChunkedAndClose) {
    const std::string requests =
        "GET /a HTTP/1.1\r\nHost: x\r\n\r\n"
        "POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
        "HEAD /c HTTP/1.1\r\nHost: x\r\n\r\n"
        "PUT /d HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
        "GET /e HTTP/1.1\r\n\r\n";
    for (std::size_t step : {1u, 3u, 1000u}) {
        const auto reqs = frame(Protocol::http, Role::request, requests, step);
        ASSERT_EQ(reqs.size(), 5u);
        EXPECT_EQ(reqs[0].summary, "GET /a HTTP/1.1");
        EXPECT_EQ(reqs[1].verb, "POST");
        EXPECT_EQ(reqs[2].verb, "HEAD");
        EXPECT_EQ(reqs[3].path, "/d");

        const std::string responses =
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nDate: Mon\r\n\r\nhi"
            "HTTP/1.1 100 Continue\r\n\r\n"
            "HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n4;x=y\r\nabcd\r\n2\r\nef\r\n0\r\nTrailer: t\r\n\r\n"
            "HTTP/1.1 200 OK\r\nContent-Length: 999\r\n\r\n"  // HEAD: no body despite the length
            "HTTP/1.1 204 No Content\r\n\r\n"
            "HTTP/1.1 200 OK\r\n\r\nuntil the end";
        const auto resp = frame(Protocol::http, Role::response, responses, step, DivergenceRules::defaults(), reqs);
        ASSERT_EQ(resp.size(), 5u) << "step " << step;
        EXPECT_EQ(resp[4].excerpt, "HTTP/1.1 200 OK\r\n\r\nuntil the end");
    }
}

TEST(ProxyHttpFramer, IgnoredHeadersAndBodiesDoNotChangeTheHash) {
    const auto rules = DivergenceRules::parse("http.ignore-header X-Request-Id\nhttp.ignore-body /random*\n", "rules");
    auto with_defaults = rules;
    with_defaults.ignore_headers.push_back("date");
    Message get_a;
    get_a.verb = "GET";
    get_a.path = "/a";
    Message get_random = get_a;
    get_random.path = "/random/7";
    const auto h = [&](const std::string& resp, const Message& req) {
        return frame(Protocol::http, Role::response, resp, 5, with_defaults, {req}).at(0).hash;
    };
    const std::string a = "HTTP/1.1 200 OK\r\nDate: Mon\r\nX-Request-Id: 1\r\nContent-Length: 2\r\n\r\nhi";
    const std::string b = "HTTP/1.1 200 OK\r\nDate: Tue\r\nx-request-id: 2\r\nContent-Length: 2\r\n\r\nhi";
    const std::string c = "HTTP/1.1 200 OK\r\nDate: Tue\r\nx-request-id: 2\r\nContent-Length: 2\r\n\r\nho";
    EXPECT_EQ(h(a, get_a), h(b, get_a));
    EXPECT_NE(h(a, get_a), h(c, get_a));
    EXPECT_EQ(h(a, get_random), h(c, get_random));
}

TEST(ProxyHttpFramer, ChunkBoundariesDoNotMatter) {
    Message get;
    get.verb = "GET";
    const std::string one = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nabcdef\r\n0\r\n\r\n";
    const std::string two = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n4\r\ncdef\r\n0\r\n\r\n";
    EXPECT_EQ(frame(Protocol::http, Role::response, one, 1, {}, {get}).at(0).hash,
              frame(Protocol::http, Role::response, two, 1, {}, {get}).at(0).hash);
}

TEST(ProxyDivergenceRules, ParsesAndRejects) {
    const auto r = DivergenceRules::parse("# noise\n\nresp.ignore-command time  # clock\nhttp.ignore-header Server\n", "f");
    EXPECT_TRUE(r.ignores_command("TIME"));
    EXPECT_TRUE(r.ignores_header("server"));
    EXPECT_FALSE(r.ignores_command("GET"));
    try {
        DivergenceRules::parse("resp.ignore-command TIME\nbogus X\n", "f");
        FAIL() << "accepted an unknown rule";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ExitCode::bad_input);
        EXPECT_NE(std::string(e.what()).find("f:2"), std::string::npos) << e.what();
    }
    EXPECT_THROW(DivergenceRules::parse("resp.ignore-command\n", "f"), Error);
    EXPECT_THROW(DivergenceRules::parse("resp.ignore-command A B\n", "f"), Error);
}

TEST(ProxyDebugBuffer, OverflowIsAllOrNothing) {
    DebugBuffer b(40000);
    const std::string a(30000, 'a'), c(20000, 'c'), d(10000, 'd');
    EXPECT_TRUE(b.append(a.data(), a.size()));
    EXPECT_FALSE(b.append(c.data(), c.size()));  // would pass the limit: nothing of it is stored
    EXPECT_EQ(b.size(), 30000u);
    EXPECT_TRUE(b.append(d.data(), d.size()));  // exactly at the limit
    EXPECT_EQ(b.size(), 40000u);
    EXPECT_FALSE(b.append("x", 1));
    EXPECT_EQ(b.high_water(), 40000u);

    std::string drained;
    while (!b.empty()) {
        const auto f = b.front();
        const std::size_t n = std::min<std::size_t>(f.size(), 7777);
        drained.append(reinterpret_cast<const char*>(f.data()), n);
        b.consume(n);
    }
    EXPECT_EQ(drained, a + d);
    EXPECT_TRUE(b.append(c.data(), c.size()));
    EXPECT_EQ(b.high_water(), 40000u);
}

TEST(ProxyStreamComparer, FindsFirstDifferenceWhicheverSideLeads) {
    StreamComparer s(1000);
    EXPECT_EQ(s.feed(0, bytes("hello wor")), StreamComparer::Result::same);
    EXPECT_EQ(s.feed(1, bytes("hel")), StreamComparer::Result::same);
    EXPECT_EQ(s.feed(1, bytes("lo wXrld")), StreamComparer::Result::mismatch);
    EXPECT_EQ(s.mismatch_offset(), 7u);
    EXPECT_EQ(s.matched(), 7u);  // "hello w": equal up to the difference, whatever the pieces
    EXPECT_EQ(s.reference_excerpt(), "or");
    EXPECT_EQ(s.copy_excerpt(), "Xrld");

    StreamComparer small(4);
    EXPECT_EQ(small.feed(0, bytes("abcd")), StreamComparer::Result::same);
    EXPECT_EQ(small.feed(0, bytes("e")), StreamComparer::Result::too_far_apart);
}

TEST(ProxyEndpoint, ParsesAndExplainsBadInput) {
    EXPECT_EQ(parse_endpoint("127.0.0.1:7000", "--listen").str(), "127.0.0.1:7000");
    EXPECT_EQ(parse_endpoint("[::1]:7000", "--listen").str(), "[::1]:7000");
    EXPECT_EQ(parse_endpoint("localhost:6379", "--listen").port(), 6379);
    for (const char* bad : {"127.0.0.1", "127.0.0.1:", ":80", "::1:80", "[::1]80", "1.2.3.4:99999", "1.2.3.4:8x",
                            "no.such.host.invalid:80"}) {
        try {
            parse_endpoint(bad, "--production");
            ADD_FAILURE() << "accepted " << bad;
        } catch (const Error& e) {
            EXPECT_EQ(e.code(), ExitCode::usage);
            EXPECT_NE(std::string(e.what()).find("--production"), std::string::npos);
        }
    }
}

static MirrorStats sample_stats() {
    MirrorStats s;
    s.mode = "duplicator";
    s.uptime_s = 12.5;
    s.connections = {7, 2, 5, 1, 3, 4};
    s.bytes = {1000, 2000, 999, 1999};
    s.debug = {"10.213.0.2:6379", 7, 1, 2, 3, 4, 5};
    s.buffer = {4u << 20, 1u << 30, 123, 4567, 890, 6};
    s.debug_windows_ms = {3, 1.25, 2.5, 4.75, {1.25, 1.5, 4.75}};
    s.divergence.mode = "resp";
    s.divergence.compared = 100;
    s.divergence.ignored = 9;
    s.divergence.mismatches = 2;
    s.divergence.diverged_connections = 1;
    s.divergence.unchecked_connections = 8;
    s.divergence.reports.push_back({4, 17, false, "GET user:42", "$3\r\nbob", "$-1", 3.5, 1});
    s.record = MirrorStats::Record{"/tmp/traffic.rec", 77, true};
    s.debug_targets.push_back({"10.213.0.2:6379", 7, 1, 2, 1, 3, 4096, 0.25, 120.5, 340.25, 9, 999});
    s.debug_targets.push_back({"10.213.0.6:6379", 7, 0, 0, 0, 3, 0, 0, 0, 0, 0, 999});
    MirrorStats::ConnectionStats c;
    c.id = 42;
    c.age_ms = 1500.5;
    c.lingering = true;
    c.debug.push_back({"open", 4096, 8192, 0.25, 120.5, 340.25, 9});
    c.debug.push_back({"overflowed", 0, 262144, 0, 0, 0, 0});
    s.open_connections.push_back(c);
    return s;
}

TEST(ProxyMirrorCommand, CommandsAndRepliesRoundTrip) {
    const MirrorCommand record{MirrorCommand::Kind::record, "/var/tmp/gen-000002/input.rec"};
    EXPECT_EQ(parse_mirror_command(to_json(record)).path, record.path);
    EXPECT_EQ(parse_mirror_command(to_json(MirrorCommand{MirrorCommand::Kind::record, ""})).path, "");
    MirrorCommandReply reply;
    reply.ok = false;
    reply.error = "cannot create";
    reply.open_connections = 3;
    reply.at_s = 12.25;
    const MirrorCommandReply back = parse_mirror_command_reply(to_json(reply));
    EXPECT_FALSE(back.ok);
    EXPECT_EQ(back.error, reply.error);
    EXPECT_EQ(back.open_connections, 3u);
    EXPECT_EQ(back.at_s, 12.25);
    for (const char* bad : {"", "{}", "{\"command\":\"rotate\"}", "[1]", "not json"})
        EXPECT_THROW(parse_mirror_command(bad), Error) << bad;
    EXPECT_THROW(parse_mirror_command_reply("{\"error\":\"x\"}"), Error);
}

TEST(ProxyMirrorStats, DocumentRoundTripsThroughTheOneDefinition) {
    const MirrorStats s = sample_stats();
    EXPECT_EQ(parse_mirror_stats(to_json(s)), s);

    MirrorStats aggregator = s;
    aggregator.mode = "aggregator";
    aggregator.debug.address.clear();
    aggregator.record.reset();
    aggregator.aggregator = MirrorStats::Aggregator{3, 1, 2};
    aggregator.divergence.reports[0].index_is_byte_offset = true;
    const std::string doc = to_json(aggregator);
    EXPECT_NE(doc.find(R"("byte_offset":17)"), std::string::npos) << doc;
    EXPECT_EQ(doc.find("\"record\""), std::string::npos) << doc;
    EXPECT_EQ(parse_mirror_stats(doc), aggregator);

    MirrorStats capture = s;
    capture.mode = "capture";
    MirrorStats::Capture c;
    c.interface = "lo";
    c.port = 6379;
    c.filter = "tcp port 6379 and inbound";
    c.ring_bytes = 1 << 20;
    c.packets = 1000;
    c.packets_before_start = 15;
    c.kernel_drops = 12;
    c.interface_drops = 1;
    c.truncated_packets = 2;
    c.flows = 3;
    c.untracked_flows = 4;
    c.connections_from_start = 5;
    c.connections_joined = 6;
    c.connections_unjoinable = 7;
    c.lost_connections = 8;
    c.lost_reply_connections = 9;
    c.loss_causes = {{"acknowledged_unseen", 6}, {"reassembly_full", 0}, {"truncated", 3}};
    c.checked_with_production = 14;
    c.out_of_order_segments = 10;
    c.retransmitted_bytes = 11;
    c.overlapping_bytes = 13;
    c.cpu_s = 0.5;
    capture.capture = c;
    EXPECT_EQ(parse_mirror_stats(to_json(capture)), capture);
}

TEST(ProxyMirrorStats, MalformedDocumentsAreBadInputNotGuesses) {
    for (const char* bad : {"", "[]", "{\"buffer\":[]}", "{\"buffer\":{\"overflows\":\"many\"}}", "{\"mode\":"}) {
        try {
            parse_mirror_stats(bad);
            ADD_FAILURE() << "accepted " << bad;
        } catch (const Error& e) {
            EXPECT_EQ(e.code(), ExitCode::bad_input) << bad;
        }
    }
}

TEST(ProxyMirrorStats, ReadyEventRoundTrips) {
    MirrorReady ready;
    ready.listen = parse_endpoint("127.0.0.1:7000", "listen");
    ready.stats = parse_endpoint("[::1]:7001", "stats");
    const MirrorReady back = parse_ready_event(ready_event_json(ready, 42));
    ASSERT_TRUE(back.listen);
    EXPECT_EQ(back.listen->str(), "127.0.0.1:7000");
    ASSERT_TRUE(back.stats);
    EXPECT_EQ(back.stats->str(), "[::1]:7001");
    EXPECT_FALSE(back.debug_listen);
    EXPECT_TRUE(back.capture.empty());
    EXPECT_THROW(parse_ready_event(R"({"event":"stopped"})"), Error);

    MirrorReady capturing;
    capturing.capture = "lo:6379";
    capturing.stats = ready.stats;
    const std::string event = ready_event_json(capturing, 42);
    EXPECT_NE(event.find(R"("event":"capturing")"), std::string::npos) << event;
    const MirrorReady capture_back = parse_ready_event(event);
    EXPECT_FALSE(capture_back.listen);
    EXPECT_EQ(capture_back.capture, "lo:6379");
    ASSERT_TRUE(capture_back.stats);
}
