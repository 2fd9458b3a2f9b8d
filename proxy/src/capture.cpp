// Capture mode: production's traffic taken off the wire with libpcap (the
// kernel's TPACKET_V3 ring, a BPF filter, its drop count), each connection
// followed by a TcpConnectionTracker and mirrored to the debug copy.
#include "capture.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/if_packet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <sys/resource.h>

#include <climits>
#include <cstring>
#include <thread>

#include "iprobe/support/number.h"

namespace iprobe::proxy {

CaptureOptions parse_capture_spec(std::string_view text, std::string_view what) {
    CaptureOptions o;
    std::string_view port = text;
    if (const auto colon = text.rfind(':'); colon != std::string_view::npos) {
        o.interface = std::string(text.substr(0, colon));
        port = text.substr(colon + 1);
        if (o.interface.empty() || o.interface.size() >= IFNAMSIZ)
            throw Error(std::string(what) + " '" + std::string(text) + "': expected [INTERFACE:]PORT (e.g. lo:6379, 6379)",
                        ExitCode::usage);
    }
    o.port = static_cast<int>(parse_unsigned_or_usage(port, std::string(what) + " PORT", 1, 65535));
    return o;
}

namespace mirror_impl {

namespace {

// Captured bytes per packet: the largest a GSO segment on loopback can be.
constexpr int kSnapLength = 262144;
// The ring hands over a block when it fills or after this long: the capture
// is read in batches (the copy lags production by this much more).  Every
// block handed over is one block of the ring until it is read, so with few
// packets the ring holds blocks x this long of a stalled reader.
constexpr int kBlockTimeoutMs = 20;
constexpr std::size_t kMaxFlows = std::size_t(1) << 18;
// How long a finished connection's ports are remembered, so its last
// segments (the final ACK, a retransmitted FIN) do not look like a new one.
constexpr auto kClosedFlowMemory = std::chrono::seconds(30);
// After the kernel dropped packets, how long a connection may stay silent
// with bytes unacknowledged (TCP acknowledges within a retransmission
// timeout: the acknowledgment was dropped) before its client stream counts
// as lost; one that speaks again is judged by its sequence numbers instead.
constexpr auto kSilenceAfterDrops = std::chrono::seconds(3);
// The kernel stamps a packet once it has copied it into the ring, so a packet
// the ring took before the filter was in place may be stamped a little after:
// the capture starts this long after the filter is in place (CaptureStart),
// and the mirror says it is capturing only then.
constexpr auto kFilterSettle = std::chrono::milliseconds(5);

std::int64_t realtime_us() {
    timespec ts{};
    ::clock_gettime(CLOCK_REALTIME, &ts);  // the clock of the capture's packet stamps
    return static_cast<std::int64_t>(ts.tv_sec) * 1000000 + ts.tv_nsec / 1000;
}

std::string numeric_host(const Endpoint& e) {
    char host[NI_MAXHOST];
    if (::getnameinfo(reinterpret_cast<const sockaddr*>(&e.addr), e.len, host, sizeof host, nullptr, 0,
                      NI_NUMERICHOST) != 0)
        return {};
    return host;
}

Error activation_error(pcap_t* p, int status, const CaptureOptions& o) {
    const std::string where = "--capture " + o.str() + ": ";
    switch (status) {
    case PCAP_ERROR_NO_SUCH_DEVICE:
        return Error(where + "no interface '" + o.interface + "' in this network namespace (see `ip link`; 'any' takes them all)",
                     ExitCode::not_found);
    case PCAP_ERROR_PERM_DENIED:
        return Error(where + "capturing packets needs root or CAP_NET_RAW: " + pcap_geterr(p), ExitCode::permission);
    case PCAP_ERROR_IFACE_NOT_UP:
        return Error(where + "interface '" + o.interface + "' is down", ExitCode::unavailable);
    default:
        return Error(where + pcap_statustostr(status) + ": " + pcap_geterr(p), ExitCode::failure);
    }
}

// Whether `key`'s server address is one the capture's interface carries
// (any interface for "any"; every 127.x on lo).
bool served_on(const std::string& interface, const FlowKey& key) {
    if (interface == "any") return true;
    if (interface == "lo" && key.family == AF_INET && key.server[0] == 127) return true;
    ifaddrs* list = nullptr;
    if (::getifaddrs(&list) != 0) return false;
    bool found = false;
    for (const ifaddrs* a = list; a && !found; a = a->ifa_next) {
        if (!a->ifa_addr || interface != a->ifa_name || a->ifa_addr->sa_family != key.family) continue;
        if (key.family == AF_INET)
            found = std::memcmp(&reinterpret_cast<const sockaddr_in*>(a->ifa_addr)->sin_addr, key.server.data(), 4) == 0;
        else
            found = std::memcmp(&reinterpret_cast<const sockaddr_in6*>(a->ifa_addr)->sin6_addr, key.server.data(), 16) == 0;
    }
    ::freeifaddrs(list);
    return found;
}

}  // namespace

// --- Flow

Flow::Flow(Capture& capture, const FlowKey& key)
    : capture_(capture),
      key_(key),
      tracker_(capture.proxy().opt.buffer, capture.request_start(), *this) {}

Flow::~Flow() {
    if (connection_) connection_->detach();
}

void Flow::flow_opened(bool mid_stream) {
    from_syn_ = !mid_stream;
    ++(mid_stream ? capture_.counters.joined : capture_.counters.from_start);
    Proxy& px = capture_.proxy();
    auto c = std::make_unique<CapturedConnection>(px, capture_, px.new_connection_id(), *this, mid_stream);
    connection_ = c.get();
    px.adopt(std::move(c));
    capture_.connection_opened(*connection_, key_);
}

void Flow::flow_bytes(FlowDirection dir, std::span<const std::uint8_t> bytes) {
    if (connection_) connection_->bytes(dir, bytes);
}

void Flow::flow_ended(FlowDirection dir) {
    if (connection_) connection_->ended(dir);
}

void Flow::flow_reset() {
    if (connection_) connection_->reset();
}

void Flow::ended_unseen() { flow_reset(); }

void Flow::flow_lost(FlowDirection dir, StreamLoss why) {
    if (!connection_) return;
    connection_->lost(dir, why);
    if (dir == FlowDirection::to_server) {  // that mirrored connection is over; a join may start another
        connection_->detach();
        connection_ = nullptr;
    }
}

// --- CapturedConnection

CapturedConnection::CapturedConnection(Proxy& px, Capture& capture, std::uint32_t id, Flow& flow, bool joined)
    : MirroredStream(px, id),
      capture_(capture),
      flow_(&flow),
      client_(flow.key().client_str()),
      key_(flow.key()),
      joined_(joined),
      held_(capture.holding()),
      after_checkpoint_(capture.holding() && capture.checkpointed() && capture.packet_us() > capture.checkpoint_us()) {
    ++px_.stats.accepted;
    ++px_.stats.active;
    if (held_) return;  // fed to the copies at release()
    if (recorder_) recorder_->add(RecordKind::open, id_, capture_.packet_ns());
    open_legs();
}

CapturedConnection::~CapturedConnection() {
    capture_.connection_gone(*this);
    if (flow_) flow_->detach();
    held_ = false;
    close_source();
}

void CapturedConnection::bytes(FlowDirection dir, std::span<const std::uint8_t> b) {
    if (dir == FlowDirection::to_server) {
        px_.stats.bytes_client_to_production += b.size();
        if (held_) return keep(0, b);
        if (recorder_) recorder_->add(RecordKind::data, id_, capture_.packet_ns(), b.data(), b.size());
        client_bytes(b.data(), b.size());
    } else {
        px_.stats.bytes_production_to_client += b.size();
        if (held_ || replies_to_skip_ > 0) {
            keep(1, b);
            skip_held_replies();
            if (!held_) deliver_replies();
            return settle();
        }
        if (recorder_) recorder_->add(RecordKind::reply, id_, capture_.packet_ns(), b.data(), b.size());
        production_bytes(b.data(), b.size());
    }
    settle();
}

// --- the clone's start (--hold)

// Until the clone is ready: both directions kept from the connection's start
// (at most --buffer each; past that the clone cannot have it whole).
void CapturedConnection::keep(int dir, std::span<const std::uint8_t> b) {
    if (kept_overflow_) return;
    if (kept_[dir].size() + b.size() > px_.opt.buffer) {
        kept_overflow_ = true;
        kept_[0].clear();
        kept_[1].clear();
        if (gap_.empty()) gap_ = "more than --buffer arrived before the clone was ready";
        arrivals_.clear();
        return;
    }
    kept_[dir].append(reinterpret_cast<const char*>(b.data()), b.size());
    arrivals_.push_back({capture_.next_arrival(), capture_.packet_ns(), dir, b.size()});
}

// The first `bytes` of direction `dir` kept are not the clone's.
void CapturedConnection::drop_arrivals(int dir, std::size_t bytes) {
    for (auto it = arrivals_.begin(); it != arrivals_.end() && bytes > 0;) {
        if (it->dir != dir) {
            ++it;
            continue;
        }
        const std::size_t n = std::min(bytes, it->size);
        it->size -= n;
        bytes -= n;
        it = it->size == 0 ? arrivals_.erase(it) : it + 1;
    }
}

// How far production had read this connection when it was checkpointed: the
// clone's memory holds every request read by then (executed, or executed by
// the clone as it resumes); the first request not wholly read is the first
// the clone must be fed.  A request read in part is fed whole: the clone
// drops the part it holds when it finds the connection closed.
void CapturedConnection::checkpoint_reached(const std::optional<SocketDiag::Connection>& at) {
    if (boundary_known()) return;
    if (lost_[0]) gap_ = "client bytes lost to the capture before the clone was ready";
    if (!gap_.empty()) return;
    const std::uint64_t captured = kept_[0].size();
    std::uint64_t read = captured;  // no socket at the checkpoint: production had read all it would
    if (after_checkpoint_) {
        read = 0;
        if (joined_ && at && at->unread > 0) {
            gap_ = std::to_string(at->unread) + " bytes production had not read at the checkpoint came before the "
                   "capture could join the connection";
            return;
        }
    } else if (at && !joined_ && at->counted) {
        read = at->bytes_received - at->unread;  // exact: followed from its first byte
    } else if (at) {
        // Joined mid-stream: the bytes production had not read are the last
        // it had received, and the capture has delivered exactly those it
        // received by then (nothing of this connection captured since).
        if (at->unread > captured) {
            gap_ = std::to_string(at->unread - captured) + " bytes production had not read at the checkpoint came "
                   "before the capture joined the connection";
            return;
        }
        read = captured - at->unread;
    }
    if (read > captured) {
        gap_ = "production had read " + std::to_string(read - captured) + " bytes more than the capture delivered";
        return;
    }
    std::uint64_t start = 0, requests = 0;
    if (read > 0) {
        const Protocol framing = capture_.framing();
        if (framing != Protocol::resp && framing != Protocol::http) {
            gap_ = "no protocol to tell where a request starts (--join)";
            return;
        }
        const auto framer = Framer::create(framing, Role::request, px_.opt.rules);
        std::vector<Message> requests_kept;
        framer->feed({reinterpret_cast<const std::uint8_t*>(kept_[0].data()), kept_[0].size()}, requests_kept);
        for (Message& m : requests_kept) {
            if (start + m.size > read) break;
            start += m.size;
            ++requests;
            skipped_requests_.push_back(std::move(m));
        }
        if (start < read && framer->failed()) {
            gap_ = "the requests before the checkpoint could not be framed: " + framer->error();
            return;
        }
    }
    kept_[0].erase(0, start);
    drop_arrivals(0, start);
    boundary_ = start;
    replies_to_skip_ = requests;
    capture_.counters.skipped_requests += requests;
    skip_held_replies();
}

// Production's replies to the requests the checkpoint held are not the
// clone's to give: dropped as they come.
void CapturedConnection::skip_held_replies() {
    if (replies_to_skip_ == 0 || !boundary_) return;
    const auto framer = Framer::create(capture_.framing(), Role::response, px_.opt.rules);
    for (const Message& r : skipped_requests_) framer->expect(r);
    std::vector<Message> replies;
    framer->feed({reinterpret_cast<const std::uint8_t*>(kept_[1].data()), kept_[1].size()}, replies);
    std::size_t skipped = 0, bytes = 0;
    for (const Message& m : replies) {
        if (skipped == replies_to_skip_) break;
        bytes += m.size;
        ++skipped;
    }
    if (framer->failed()) {
        replies_to_skip_ = 0;  // the copies are still fed; their replies cannot be paired any more
        drop_arrivals(1, kept_[1].size());
        kept_[1].clear();
        lost_[1] = true;
        replies_lost_why_ = "production's replies before the checkpoint could not be framed";
        return;
    }
    kept_[1].erase(0, bytes);
    drop_arrivals(1, bytes);
    replies_to_skip_ -= skipped;
    skipped_requests_.erase(skipped_requests_.begin(), skipped_requests_.begin() + static_cast<std::ptrdiff_t>(skipped));
}

void CapturedConnection::deliver_replies(bool record) {
    if (replies_to_skip_ > 0 || kept_[1].empty()) return;
    if (recorder_ && record) recorder_->add(RecordKind::reply, id_, capture_.packet_ns(), kept_[1].data(), kept_[1].size());
    production_bytes(reinterpret_cast<const std::uint8_t*>(kept_[1].data()), kept_[1].size());
    kept_[1].clear();
    if (ended_[1]) production_ended();
}

void CapturedConnection::missed(MirrorCommandReply& reply, std::uint64_t requests, const std::string& why) {
    ++capture_.counters.missed_connections;
    capture_.counters.missed_requests += requests;
    ++px_.stats.diverged_connections;
    reply.missed.push_back({id_, client_, requests, why});
    px_.log("connection %u (%s): the clone misses its requests from the checkpoint on (%s): diverged from its start",
            id_, client_.c_str(), why.c_str());
    if (px_.stats.reports.size() < kMaxReports)
        px_.stats.reports.push_back(
            {id_, 0, "(requests from the checkpoint on)", "(served)", "(missed: " + why + ")", ms_since(px_.stats.started), 0});
}

void CapturedConnection::release(MirrorCommandReply& reply, std::vector<HeldRecord>& records) {
    if (!held_) return;
    held_ = false;
    if (!boundary_known()) checkpoint_reached(std::nullopt);
    if (!gap_.empty()) {
        missed(reply, 0, gap_);
        kept_[0].clear();
        kept_[1].clear();
        replies_to_skip_ = 0;
        recorder_.reset();
        if (closed_while_held_) end_source();
        return;
    }
    ++reply.resumed;
    ++capture_.counters.resumed;
    recorder_ = px_.recorder;  // what the clone is fed is the input that follows its checkpoint
    if (recorder_) {
        // As the capture saw it, interleaved with the other connections' by
        // Capture::release: the recording keeps production's order.
        const std::uint64_t first = arrivals_.empty() ? capture_.next_arrival() : arrivals_.front().order;
        records.push_back({2 * first, recorder_, RecordKind::open, id_,
                           arrivals_.empty() ? capture_.packet_ns() : arrivals_.front().t_ns, {}});
        std::size_t at[2] = {0, 0};
        for (const Arrival& a : arrivals_) {
            if (a.dir == 1 && replies_to_skip_ > 0) continue;  // recorded as they are fed
            records.push_back({2 * a.order + 1, recorder_, a.dir == 0 ? RecordKind::data : RecordKind::reply, id_,
                               a.t_ns, kept_[a.dir].substr(at[a.dir], a.size)});
            at[a.dir] += a.size;
        }
        if (ended_[0])
            records.push_back({records.back().order, recorder_, RecordKind::close, id_, records.back().t_ns, {}});
    }
    arrivals_.clear();
    open_legs();
    if (!kept_[0].empty()) {
        client_bytes(reinterpret_cast<const std::uint8_t*>(kept_[0].data()), kept_[0].size());
        kept_[0].clear();
    }
    if (lost_[1]) stop_comparing(replies_lost_why_);
    deliver_replies(false);
    if (ended_[0]) client_ended();
    if (closed_while_held_) {
        if (recorder_ && !ended_[0])
            records.push_back({records.empty() ? 0 : records.back().order, recorder_, RecordKind::close, id_,
                               capture_.packet_ns(), {}});
        recorder_.reset();
        end_source();
    }
    settle();
}

void CapturedConnection::ended(FlowDirection dir) {
    ended_[static_cast<int>(dir)] = true;
    if (held_) {
        if (ended_[0] && ended_[1]) close_source();
        return;
    }
    if (dir == FlowDirection::to_server) {
        if (recorder_) recorder_->add(RecordKind::close, id_, capture_.packet_ns());
        client_ended();
    } else if (replies_to_skip_ == 0) {
        production_ended();
    }
    if (ended_[0] && ended_[1]) close_source();
    settle();
}

void CapturedConnection::reset() {
    close_source();
    settle();
}

void CapturedConnection::lost(FlowDirection dir, StreamLoss why) {
    lost_[static_cast<int>(dir)] = true;
    ++capture_.counters.loss_causes[static_cast<std::size_t>(why)];
    if (dir == FlowDirection::to_client)
        replies_lost_why_ = std::string("production's replies were lost to the capture: ") + stream_loss_words(why);
    if (held_) {
        if (dir == FlowDirection::to_server) {
            ++capture_.counters.lost_connections;
            if (gap_.empty())
                gap_ = std::string("client bytes lost to the capture before the clone was ready: ") +
                       stream_loss_words(why);
            close_source();
        } else {
            ++capture_.counters.lost_reply_connections;
        }
        return;
    }
    if (dir == FlowDirection::to_server) {
        ++capture_.counters.lost_connections;
        px_.rate_limited_log(capture_.counters.lost_connections,
                             "connection %u (%s): client bytes lost to the capture (%s): debug side closed, "
                             "connection marked diverged",
                             id_, client_.c_str(), stream_loss_words(why));
        abandon_legs("capture_loss");
        close_source();
    } else {
        ++capture_.counters.lost_reply_connections;
        stop_comparing(replies_lost_why_);
    }
    settle();
}

void CapturedConnection::close_source() {
    if (source_closed_ || closed_while_held_) return;
    --px_.stats.active;
    ++px_.stats.closed;
    if (held_) {
        closed_while_held_ = true;  // kept until release()
        return;
    }
    finish_source();
}

void CapturedConnection::finish_source() {
    if (recorder_ && !ended_[0]) recorder_->add(RecordKind::close, id_, capture_.packet_ns());
    recorder_.reset();
    end_source();
}

void CapturedConnection::describe_source(MirrorStats::ConnectionStats& s) const {
    s.captured = MirrorStats::ConnectionStats::Captured{client_, joined_, lost_[0], lost_[1]};
    if (held_) s.captured->status = "held";
}

// --- Capture

Capture::Capture(Proxy& px, const CaptureOptions& options)
    : px_(px),
      options_(options),
      request_start_(request_start_test(options.join)),
      pcap_(nullptr, pcap_close),
      holding_(px.opt.hold),
      started_us_(realtime_us() - static_cast<std::int64_t>(px.now_ns() / 1000)) {
    char error[PCAP_ERRBUF_SIZE] = "";
    pcap_.reset(pcap_create(options_.interface.c_str(), error));
    if (!pcap_) throw Error("--capture " + options_.str() + ": " + error, ExitCode::failure);
    pcap_t* p = pcap_.get();
    pcap_set_snaplen(p, kSnapLength);
    pcap_set_promisc(p, 0);
    pcap_set_timeout(p, kBlockTimeoutMs);
    pcap_set_buffer_size(p, static_cast<int>(std::min<std::size_t>(options_.ring, INT_MAX)));
    if (const int status = pcap_activate(p); status < 0) throw activation_error(p, status, options_);
    linktype_ = pcap_datalink(p);
    if (!link_type_supported(linktype_))
        throw Error("--capture " + options_.str() + ": the interface's link type " +
                        (pcap_datalink_val_to_name(linktype_) ? pcap_datalink_val_to_name(linktype_) : "?") +
                        " is not one iprobe reads (Ethernet, Linux cooked, raw IP)",
                    ExitCode::unavailable);
    filter_ = filter_expression();
    bpf_program program{};
    if (pcap_compile(p, &program, filter_.c_str(), 1, PCAP_NETMASK_UNKNOWN) != 0)
        throw Error("--capture " + options_.str() + ": filter '" + filter_ + "': " + pcap_geterr(p));
    const int set = pcap_setfilter(p, &program);
    pcap_freecode(&program);
    if (set != 0) throw Error("--capture " + options_.str() + ": installing the filter: " + std::string(pcap_geterr(p)));
    // pcap_setfilter rejected every packet for a moment while it swapped
    // filters; the ring holds packets from before that moment.
    start_ = CaptureStart(realtime_us() + std::chrono::microseconds(kFilterSettle).count());
    std::this_thread::sleep_for(kFilterSettle);
    if (pcap_setnonblock(p, 1, error) != 0) throw Error("--capture " + options_.str() + ": " + error);
    // Loopback shows every packet twice, leaving and arriving: the socket is
    // told to skip the leaving copy, which the kernel then neither clones nor
    // copies into the ring (half the capture's cost on loopback).  Where the
    // option is missing (before Linux 4.20), libpcap drops that copy itself.
    if (options_.interface == "lo") {
        const int one = 1;
        ::setsockopt(pcap_fileno(p), SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof one);
    }
    const int fd = pcap_get_selectable_fd(p);
    if (fd < 0) throw Error("--capture " + options_.str() + ": the capture has no descriptor to wait on");
    // The capture keeps its descriptor; the loop watches a duplicate of it.
    w_ = Watched(px_.epfd, UniqueFd(::fcntl(fd, F_DUPFD_CLOEXEC, 3)), this);
    if (!w_) throw_errno("dup");
    w_.want(EPOLLIN);
    production_here_ = diag_.listening(AF_INET, static_cast<std::uint16_t>(options_.port)) ||
                       diag_.listening(AF_INET6, static_cast<std::uint16_t>(options_.port));
    if (production_here_) follow_open_connections();
}

// Production's connections open before the capture: known from its sockets
// at once, so one that stays quiet is listed (joining) instead of unseen
// until it speaks.
void Capture::follow_open_connections() {
    for (const int family : {AF_INET, AF_INET6})
        for (const auto& [key, connection] : diag_.connections(family, static_cast<std::uint16_t>(options_.port))) {
            if (!served_on(options_.interface, key) || flows_.count(key) || flows_.size() >= kMaxFlows) continue;
            flows_.emplace(key, std::make_unique<Flow>(*this, key));
        }
}

Capture::~Capture() {
    w_.close();
    flows_.clear();
}

// Production's port, and not the mirror's own connections to the debug copy
// (which may use the same port).  No direction in the filter: on this kernel
// a ring fed through a filter that drops loopback's leaving copies ("inbound")
// held its last block back until more packets came (PACKET_IGNORE_OUTGOING,
// above, has no such effect).
std::string Capture::filter_expression() const {
    std::string f = "tcp port " + std::to_string(options_.port);
    for (const Endpoint& debug : px_.opt.debug) {
        const std::string host = numeric_host(debug), port = std::to_string(debug.port());
        if (!host.empty())
            f += " and not (src host " + host + " and src port " + port + ") and not (dst host " + host +
                 " and dst port " + port + ")";
    }
    return f;
}

void Capture::on_event(std::uint32_t) {
    ring_drained_ = false;
    for (int round = 0; round < 64; ++round) {
        const int n = pcap_dispatch(pcap_.get(), -1, on_frame, reinterpret_cast<u_char*>(this));
        if (n < 0)
            throw Error("capture on " + options_.str() + " failed: " + pcap_geterr(pcap_.get()), ExitCode::unavailable);
        if (n == 0) {
            drained_at_ = Clock::now();
            ring_drained_ = true;
            break;
        }
    }
}

void Capture::on_frame(u_char* self, const pcap_pkthdr* header, const u_char* bytes) {
    reinterpret_cast<Capture*>(self)->frame(*header, bytes);
}

void Capture::frame(const pcap_pkthdr& header, const std::uint8_t* bytes) {
    const std::int64_t at_us = static_cast<std::int64_t>(header.ts.tv_sec) * 1000000 + header.ts.tv_usec;
    if (!start_.admits(at_us)) return;
    TcpPacket p;
    if (!parse_tcp_packet(linktype_, {bytes, header.caplen}, p)) return;
    ++counters.packets;
    if (p.segment.missing > 0) ++counters.truncated_packets;
    packet(p, at_us);
}

void Capture::packet(const TcpPacket& p, std::int64_t at_us) {
    packet_us_ = at_us;
    const auto port = static_cast<std::uint16_t>(options_.port);
    const bool to_server = p.dst_port == port;
    if (!to_server && p.src_port != port) return;
    const FlowDirection dir = to_server ? FlowDirection::to_server : FlowDirection::to_client;
    FlowKey key;
    key.family = p.family;
    key.client = to_server ? p.src : p.dst;
    key.server = to_server ? p.dst : p.src;
    key.client_port = to_server ? p.src_port : p.dst_port;
    key.server_port = port;
    const TcpSegment& s = p.segment;
    const bool syn = to_server && s.has(TcpSegment::kSyn) && !s.has(TcpSegment::kAck);
    auto it = flows_.find(key);
    if (it != flows_.end()) {
        Flow& f = *it->second;
        const bool same_syn = f.opened_from_syn() && f.syn_seq() == s.seq;
        if (!syn || same_syn) {
            // The first packet of a held connection from after the
            // checkpoint: the capture has delivered all it had before.
            if (holding_ && checkpointed() && at_us > checkpoint_us_)
                if (CapturedConnection* c = f.connection(); c && c->held() && !c->boundary_known()) resolve(*c, key);
            f.last_packet_us = at_us;
            f.segment(dir, s);
            if (f.tracker().phase() == TcpConnectionTracker::Phase::closed && !f.counted_closed) flow_closed(f);
            if (f.tracker().phase() == TcpConnectionTracker::Phase::unjoinable) note_unjoinable(f);
            return;
        }
        // A new connection on the same ports: the old one ended unseen.
        f.ended_unseen();
        forget(f);
    } else if (s.has(TcpSegment::kRst) && !syn) {
        return;  // the end of a connection not followed
    }
    if (flows_.size() >= kMaxFlows) {
        ++counters.untracked_flows;
        return;
    }
    auto flow = std::make_unique<Flow>(*this, key);
    Flow& f = *flow;
    if (syn) f.set_syn_seq(s.seq);
    f.last_packet_us = at_us;
    flows_.emplace(key, std::move(flow));
    f.segment(dir, s);
    if (f.tracker().phase() == TcpConnectionTracker::Phase::closed && !f.counted_closed) flow_closed(f);
    if (f.tracker().phase() == TcpConnectionTracker::Phase::unjoinable) note_unjoinable(f);
}

// A connection the mirror will never follow: counted once, when that is known.
void Capture::note_unjoinable(Flow& f) {
    if (f.counted_unjoinable || f.followed()) return;
    f.counted_unjoinable = true;
    ++counters.unjoinable;
}

void Capture::flow_closed(Flow& f) {
    f.counted_closed = true;
    f.closed_at = Clock::now();
    closed_.emplace_back(f.closed_at, f.key());
    note_unjoinable(f);
}

void Capture::forget(Flow& f) {
    for (const FlowDirection dir : {FlowDirection::to_server, FlowDirection::to_client}) {
        const auto& c = f.tracker().stream(dir).counters();
        counters.closed_streams.out_of_order_segments += c.out_of_order_segments;
        counters.closed_streams.retransmitted_bytes += c.retransmitted_bytes;
        counters.closed_streams.overlapping_bytes += c.overlapping_bytes;
    }
    if (!f.counted_closed) note_unjoinable(f);
    const FlowKey key = f.key();
    flows_.erase(key);
}

void Capture::tick() {
    pcap_stat st{};
    if (pcap_stats(pcap_.get(), &st) == 0) {
        if (st.ps_drop > kernel_.ps_drop) drops_noticed();
        kernel_ = st;
    }
    if (!checks_.empty() && Clock::now() >= checks_due_) {
        on_event(EPOLLIN);  // read the ring to its end (it may be quiet now)
        if (drained_at_ >= checks_due_) check_with_production();
    }
    if (drops_noticed_us_ != 0 &&
        realtime_us() - drops_noticed_us_ >= std::chrono::microseconds(kSilenceAfterDrops).count()) {
        // Connections the capture heard nothing from since it dropped packets
        // and that production's sockets cannot vouch for.
        for (auto& [key, flow] : flows_)
            if (flow->last_packet_us < drops_noticed_us_ && !(production_here_ && flow->opened_from_syn()))
                flow->tracker().capture_dropped_while_silent();
        drops_noticed_us_ = 0;
    }
    // A suspected hole ages only while the ring holds nothing more: after a
    // stall the segment may still wait in a block not read yet.
    if (ring_drained_)
        for (auto& [key, flow] : flows_) flow->tracker().age_suspected_losses();
    const auto now = Clock::now();
    if (now - last_expiry_ < std::chrono::seconds(1)) return;
    last_expiry_ = now;
    while (!closed_.empty() && now - closed_.front().first >= kClosedFlowMemory) {
        const auto [at, key] = closed_.front();
        closed_.pop_front();
        auto it = flows_.find(key);
        if (it != flows_.end() && it->second->counted_closed && it->second->closed_at == at) forget(*it->second);
    }
}

// The kernel dropped packets: which connections lost bytes?  Production's own
// sockets know how many bytes each received; read them now, compare once
// every packet captured before now has been read.
void Capture::drops_noticed() {
    if (drops_noticed_us_ == 0) drops_noticed_us_ = realtime_us();
    if (!production_here_ || !checks_.empty()) return;
    for (auto& [key, flow] : flows_) {
        if (!flow->opened_from_syn() || flow->tracker().phase() != TcpConnectionTracker::Phase::open ||
            flow->tracker().lost(FlowDirection::to_server))
            continue;
        checks_.push_back({key, flow.get(), diag_.lookup(key)});
    }
    // A block holding packets from before now is handed over within a block
    // timeout; the ring is then read to its end.
    checks_due_ = Clock::now() + std::chrono::milliseconds(3 * kBlockTimeoutMs);
}

void Capture::check_with_production() {
    for (const Check& c : checks_) {
        const auto it = flows_.find(c.key);
        if (it == flows_.end() || it->second.get() != c.flow) continue;
        TcpConnectionTracker& t = it->second->tracker();
        if (!it->second->opened_from_syn() || t.phase() != TcpConnectionTracker::Phase::open) continue;
        ++counters.checked_with_production;
        // No socket, or one past both FINs, while the capture still sees the
        // connection open: it missed the connection's end, and maybe bytes.
        const bool ended_unseen = !c.production || !c.production->open;
        const bool bytes_unseen = c.production && c.production->counted &&
                                  c.production->bytes_received > t.stream(FlowDirection::to_server).delivered();
        if (ended_unseen || bytes_unseen) t.client_bytes_lost(StreamLoss::production_received_more);
    }
    checks_.clear();
}

MirrorStats::Capture Capture::snapshot() const {
    MirrorStats::Capture s;
    s.interface = options_.interface;
    s.port = options_.port;
    s.filter = filter_;
    s.ring_bytes = options_.ring;
    s.packets = counters.packets;
    s.packets_before_start = start_.set_aside();
    s.kernel_drops = kernel_.ps_drop;
    s.interface_drops = kernel_.ps_ifdrop;
    s.truncated_packets = counters.truncated_packets;
    s.flows = flows_.size();
    s.untracked_flows = counters.untracked_flows;
    s.connections_from_start = counters.from_start;
    s.connections_joined = counters.joined;
    s.connections_unjoinable = counters.unjoinable;
    for (const auto& [key, flow] : flows_)
        if (flow->tracker().phase() == TcpConnectionTracker::Phase::joining) ++s.connections_joining;
    s.lost_connections = counters.lost_connections;
    s.lost_reply_connections = counters.lost_reply_connections;
    for (std::size_t i = 0; i < kStreamLossCauses; ++i)
        s.loss_causes[stream_loss_name(static_cast<StreamLoss>(i))] = counters.loss_causes[i];
    s.checked_with_production = counters.checked_with_production;
    s.holding = holding_;
    s.checkpoint_connections = counters.checkpoint_connections;
    s.resumed_connections = counters.resumed;
    s.skipped_requests = counters.skipped_requests;
    s.missed_connections = counters.missed_connections;
    s.missed_requests = counters.missed_requests;
    TcpStreamReassembler::Counters sum = counters.closed_streams;
    for (const auto& [key, flow] : flows_)
        for (const FlowDirection dir : {FlowDirection::to_server, FlowDirection::to_client}) {
            const auto& c = flow->tracker().stream(dir).counters();
            sum.out_of_order_segments += c.out_of_order_segments;
            sum.retransmitted_bytes += c.retransmitted_bytes;
            sum.overlapping_bytes += c.overlapping_bytes;
        }
    s.out_of_order_segments = sum.out_of_order_segments;
    s.retransmitted_bytes = sum.retransmitted_bytes;
    s.overlapping_bytes = sum.overlapping_bytes;
    rusage ru{};
    ::getrusage(RUSAGE_SELF, &ru);
    s.cpu_s = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
              static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
    return s;
}

// --- the clone's start (--hold)

Protocol Capture::framing() const {
    if (options_.join == Protocol::resp || options_.join == Protocol::http) return options_.join;
    return px_.opt.divergence;
}

void Capture::connection_opened(CapturedConnection& c, const FlowKey& key) {
    if (!c.held()) return;
    held_.push_back(&c);
    if (c.opened_after_checkpoint()) resolve(c, key);
}

void Capture::resolve(CapturedConnection& c, const FlowKey& key) {
    const auto it = at_checkpoint_.find(key);
    c.checkpoint_reached(it == at_checkpoint_.end() ? std::nullopt : std::optional(it->second));
}

// Production is frozen (CRIU's post-dump hook): how far it has read each
// connection, from its own sockets.  Quick: production waits for the answer.
void Capture::checkpoint(MirrorCommandReply& reply) {
    if (checkpointed()) {
        reply.error = "a checkpoint was already marked";
        return;
    }
    if (production_here_)
        for (const int family : {AF_INET, AF_INET6})
            for (auto& [key, connection] : diag_.connections(family, static_cast<std::uint16_t>(options_.port)))
                if (served_on(options_.interface, key)) at_checkpoint_.emplace(key, connection);
    checkpoint_us_ = realtime_us();
    counters.checkpoint_connections = at_checkpoint_.size();
    reply.connections = at_checkpoint_.size();
}

// The clone is ready: every held connection goes to it from the first
// request the checkpoint did not hold.
void Capture::release(MirrorCommandReply& reply) {
    if (!checkpointed()) {
        // The hook never reached us: where each connection's copy must
        // start is unknown; the clone is told so, never fed a guess.
        checkpoint_us_ = realtime_us();
        for (CapturedConnection* c : held_) c->fail_hold("the checkpoint hook did not reach the mirror");
    }
    if (!holding_) {
        reply.error = "already released";
        return;
    }
    on_event(EPOLLIN);  // what the ring holds from before now
    holding_ = false;
    std::vector<CapturedConnection*> held;
    held.swap(held_);
    std::vector<HeldRecord> records;
    for (CapturedConnection* c : held) {
        if (!c->boundary_known()) resolve(*c, c->key());
        c->release(reply, records);
    }
    std::stable_sort(records.begin(), records.end(),
                     [](const HeldRecord& a, const HeldRecord& b) { return a.order < b.order; });
    for (const HeldRecord& r : records) r.recorder->add(r.kind, r.connection, r.t_ns, r.bytes.data(), r.bytes.size());
    reply.connections = counters.checkpoint_connections;
    reply.skipped_requests = counters.skipped_requests;
    px_.log("the clone's start: %zu connection(s) fed from the first request the checkpoint did not hold (%llu "
            "request(s) it held skipped), %zu missed",
            static_cast<std::size_t>(reply.resumed), static_cast<unsigned long long>(reply.skipped_requests),
            reply.missed.size());
}

void Capture::unfollowed(std::vector<MirrorStats::ConnectionStats>& out, std::size_t max, Clock::time_point now) const {
    for (const auto& [key, flow] : flows_) {
        if (out.size() >= max) return;
        const auto phase = flow->tracker().phase();
        if (phase != TcpConnectionTracker::Phase::joining && phase != TcpConnectionTracker::Phase::unjoinable) continue;
        MirrorStats::ConnectionStats s;
        s.age_ms = std::chrono::duration<double, std::milli>(now - flow->first_seen).count();
        MirrorStats::ConnectionStats::Captured c;
        c.client = key.client_str();
        c.status = phase == TcpConnectionTracker::Phase::joining ? "joining" : "unjoinable";
        s.captured = std::move(c);
        out.push_back(std::move(s));
    }
}

}  // namespace mirror_impl
}  // namespace iprobe::proxy
