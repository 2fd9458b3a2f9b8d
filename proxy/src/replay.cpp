#include "iprobe/proxy/replay.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <optional>
#include <signal.h>
#include <vector>

#include "recording.h"
#include "iprobe/proxy/stream_compare.h"
#include "iprobe/support/error.h"
#include "iprobe/support/json.h"
#include "reply_queues.h"

namespace iprobe::proxy {

namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kMaxReports = 100;

class ReplyCheck;

// A reply that differed, judged once the replay is over: requests that were
// in flight at production at the same time (each sent before the other was
// answered) may have run there in either order, whatever order the
// recording lists them in.  A difference is `reordered` when the replayed
// reply is production's reply to the same request (same bytes) concurrent
// with it, whose own replayed reply differed too; each production reply
// explains one difference at most.  The rest diverged.
struct Difference {
    ReplyCheck* check;
    std::uint64_t index;
    std::uint64_t request, production, replayed;  // hashes
    std::uint64_t sent_ns, answered_ns;           // at production, as recorded
    std::string request_text, production_excerpt, replayed_excerpt;
};

// The service's replies on one replayed connection against production's, as
// recorded.  Everything production sent is known up front, so it is framed
// (and the requests with it) before the first byte goes out.
class ReplyCheck {
public:
    ReplyCheck(std::uint32_t connection, const ReplayOptions& opt, DivergenceStats& out,
               std::vector<Difference>& differences)
        : connection_(connection), opt_(opt), out_(out), differences_(differences) {
        if (opt.compare == Protocol::stream) {
            stream_ = std::make_unique<StreamComparer>(std::size_t(64) << 20);
        } else {
            request_framer_ = Framer::create(opt.compare, Role::request, opt.rules);
            framer_[0] = Framer::create(opt.compare, Role::response, opt.rules);
            framer_[1] = Framer::create(opt.compare, Role::response, opt.rules);
        }
    }
    void request(const std::string& bytes, std::uint64_t t_ns) {
        if (!request_framer_ || failed_) return;
        scratch_.clear();
        request_framer_->feed(as_span(bytes), scratch_);
        if (request_framer_->failed()) return fail();
        sent_ns_.insert(sent_ns_.end(), scratch_.size(), t_ns);
        for (auto& m : scratch_) {
            framer_[0]->expect(m);
            framer_[1]->expect(m);
            queues_.requests.push_back(std::move(m));
        }
    }
    void recorded_reply(const std::string& bytes, std::uint64_t t_ns) {
        saw_reference_ = true;
        feed(0, as_span(bytes));
        answered_ns_.resize(std::max(answered_ns_.size(), queues_.replies[0].size() + matched_reference_), t_ns);
    }
    void report(std::uint64_t index, const std::string& request, const std::string& ref, const std::string& copy) {
        ++out_.mismatches;
        if (reported_) {
            if (opt_.rules.every_difference && out_.reports.size() < kMaxReports)
                out_.reports.push_back({connection_, index, stream_ != nullptr, request, ref, copy, 0, 0});
            return;
        }
        reported_ = true;
        ++out_.diverged_connections;
        if (out_.reports.size() < kMaxReports)
            out_.reports.push_back({connection_, index, stream_ != nullptr, request, ref, copy, 0, 0});
    }
    void reply(std::span<const std::uint8_t> bytes) { feed(1, bytes); }
    // The service's replies framed so far; nullopt once they cannot be told apart.
    std::optional<std::uint64_t> replies() const {
        if (failed_ || stream_) return std::nullopt;
        return replies_;
    }
    // The service closed (or the drain ended): what is left unmatched on
    // either side is a difference too.
    void finish(bool service_closed) {
        if (failed_ || done_) return;
        done_ = true;
        if (!saw_reference_) {
            ++out_.unchecked_connections;
            return;
        }
        if (stream_) {
            out_.compared += stream_->matched();  // bytes, in stream mode
            if (stream_->unmatched(0) != stream_->unmatched(1))
                report(stream_->matched(), "", stream_->unmatched(0) ? "(more bytes)" : "(end of stream)",
                       stream_->unmatched(1) ? "(more bytes)" : "(end of stream)");
            return;
        }
        if (service_closed) {
            scratch_.clear();
            framer_[1]->finish(scratch_);
            for (auto& m : scratch_) queues_.replies[1].push_back(std::move(m));
            match();
        }
        if (queues_.replies[0].size() != queues_.replies[1].size())
            report(queues_.index, queues_.requests.empty() ? std::string() : queues_.requests.front().summary,
                   queues_.replies[0].empty() ? "(no reply)" : queues_.replies[0].front().excerpt,
                   queues_.replies[1].empty() ? "(no reply)" : queues_.replies[1].front().excerpt);
    }

private:
    static std::span<const std::uint8_t> as_span(const std::string& s) {
        return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
    }
    void feed(int side, std::span<const std::uint8_t> bytes) {
        if (failed_ || done_) return;
        if (stream_) {
            const auto r = stream_->feed(side, bytes);
            if (r == StreamComparer::Result::mismatch) {
                out_.compared += stream_->matched();
                report(stream_->mismatch_offset(), "", stream_->reference_excerpt(), stream_->copy_excerpt());
                done_ = true;
            } else if (r == StreamComparer::Result::too_far_apart) {
                fail();
            }
            return;
        }
        scratch_.clear();
        framer_[side]->feed(bytes, scratch_);
        if (framer_[side]->failed()) return fail();
        if (side == 1) replies_ += scratch_.size();
        for (auto& m : scratch_) queues_.replies[side].push_back(std::move(m));
        match();
    }
    void match() {
        const std::size_t before = queues_.replies[0].size();
        out_.ignored += queues_.match(opt_.rules, [&](std::uint64_t index, const Message& req, const Message& ref,
                                                      const Message& copy, auto) {
            ++out_.compared;
            if (ref.hash == copy.hash) return;
            const auto at = [](const std::vector<std::uint64_t>& v, std::uint64_t i) {
                return i < v.size() ? v[i] : std::uint64_t(0);
            };
            differences_.push_back({this, index, req.hash, ref.hash, copy.hash, at(sent_ns_, index),
                                    at(answered_ns_, index), req.summary, ref.excerpt, copy.excerpt});
        });
        matched_reference_ += before - queues_.replies[0].size();
    }
    void fail() {
        if (failed_) return;
        failed_ = true;
        ++out_.unchecked_connections;
    }

    std::uint32_t connection_;
    const ReplayOptions& opt_;
    DivergenceStats& out_;
    std::vector<Difference>& differences_;
    std::vector<std::uint64_t> sent_ns_, answered_ns_;  // per request, at production (recorded)
    std::size_t matched_reference_ = 0;                 // reference replies popped by match()
    std::unique_ptr<Framer> request_framer_, framer_[2];
    std::unique_ptr<StreamComparer> stream_;
    ReplyQueues queues_;
    std::vector<Message> scratch_;
    bool saw_reference_ = false, reported_ = false, failed_ = false, done_ = false;
    std::uint64_t replies_ = 0;
};

struct ReplayConnection {
    UniqueFd fd;
    bool connected = false;
    std::string out;
    std::size_t offset = 0;
    bool ended = false;      // the recorded client closed: shut down after sending
    bool shut = false;
    bool done = false;       // the service closed too (or failed)
    std::unique_ptr<ReplyCheck> check;
    // Ordered replay: the requests handed to the connection so far.
    std::unique_ptr<Framer> sent_framer;
    std::uint64_t requests_sent = 0;
    std::vector<Message> scratch;
    // Requests sent that the service has not answered yet (0 when unknown).
    std::uint64_t unanswered() const {
        if (done || !check) return 0;
        const auto answered = check->replies();
        return answered && *answered < requests_sent ? requests_sent - *answered : 0;
    }
};

void classify_differences(std::vector<Difference>& differences, DivergenceStats& out) {
    // Differences to the same request whose times at production overlap,
    // directly or through others, form a group any order of which production
    // may have run; within it each production reply explains one replayed
    // reply.  Groups: by request, swept in order of sending.
    std::vector<Difference*> by_time;
    for (Difference& d : differences) by_time.push_back(&d);
    std::stable_sort(by_time.begin(), by_time.end(), [](const Difference* a, const Difference* b) {
        return a->request != b->request ? a->request < b->request : a->sent_ns < b->sent_ns;
    });
    std::map<const Difference*, std::size_t> group_of;
    std::map<std::pair<std::size_t, std::uint64_t>, std::size_t> explaining;  // (group, production reply) -> unused
    std::size_t group = 0;
    std::uint64_t group_request = 0, group_end = 0;
    for (std::size_t i = 0; i < by_time.size(); ++i) {
        const Difference& d = *by_time[i];
        if (i == 0 || d.request != group_request || d.sent_ns > group_end) {
            ++group;
            group_request = d.request;
            group_end = d.answered_ns;
        }
        group_end = std::max(group_end, d.answered_ns);
        group_of[&d] = group;
        ++explaining[{group, d.production}];
    }
    for (Difference& d : differences) {
        const auto it = explaining.find({group_of[&d], d.replayed});
        if (it != explaining.end() && it->second > 0) {
            --it->second;
            ++out.reordered;
        } else {
            d.check->report(d.index, d.request_text, d.production_excerpt, d.replayed_excerpt);
        }
    }
    differences.clear();
}

}  // namespace

// Production's order across connections, from the records' stamps (the
// mirror's reads, or the capture's packet stamps, which a capture may hand
// over slightly out of order): each connection's records keep their order,
// the connections are merged by time.
void in_production_order(std::vector<Record>& records) {
    std::map<std::uint32_t, std::uint64_t> latest;
    std::vector<std::pair<std::uint64_t, std::size_t>> keys;
    keys.reserve(records.size());
    for (std::size_t i = 0; i < records.size(); ++i) {
        std::uint64_t& t = latest[records[i].connection];
        t = std::max(t, records[i].t_ns);
        keys.emplace_back(t, i);
    }
    std::stable_sort(keys.begin(), keys.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<Record> ordered;
    ordered.reserve(records.size());
    for (const auto& [t, i] : keys) ordered.push_back(std::move(records[i]));
    records.swap(ordered);
}

ReplayResult run_replay(const ReplayOptions& opt) {
    std::vector<Record> records = read_recording(opt.path);
    if (opt.ordered && (opt.compare == Protocol::resp || opt.compare == Protocol::http)) in_production_order(records);
    ::signal(SIGPIPE, SIG_IGN);
    ReplayResult result;
    if (!records.empty()) result.recorded_s = static_cast<double>(records.back().t_ns) / 1e9;

    std::map<std::uint32_t, ReplayConnection> conns;
    std::vector<Difference> differences;
    result.comparison.mode = protocol_name(opt.compare);
    if (opt.compare != Protocol::off) {
        // Production's side of every connection, framed before anything is sent.
        for (const Record& r : records) {
            if (r.kind == RecordKind::open) {
                conns[r.connection].check =
                    std::make_unique<ReplyCheck>(r.connection, opt, result.comparison, differences);
                continue;
            }
            auto it = conns.find(r.connection);
            if (it == conns.end()) continue;
            if (r.kind == RecordKind::data) it->second.check->request(r.bytes, r.t_ns);
            if (r.kind == RecordKind::reply) it->second.check->recorded_reply(r.bytes, r.t_ns);
        }
    }
    // Production's order across connections: a request waits for every
    // other connection's requests sent before it to be answered.
    result.ordered = opt.ordered && (opt.compare == Protocol::resp || opt.compare == Protocol::http);
    if (result.ordered)
        for (auto& [id, c] : conns) c.sent_framer = Framer::create(opt.compare, Role::request, opt.rules);
    const auto others_answered = [&](std::uint32_t connection) {
        for (const auto& [id, c] : conns)
            if (id != connection && c.unanswered() > 0) return false;
        return true;
    };
    Clock::time_point waiting_since{};
    const auto start = Clock::now();
    std::size_t next = 0;
    char buf[65536];
    Clock::time_point drain_deadline{};

    for (;;) {
        const auto now = Clock::now();
        // Release every record that is due.
        while (next < records.size()) {
            const Record& r = records[next];
            if (opt.speed > 0) {
                const auto due = start + std::chrono::nanoseconds(static_cast<std::int64_t>(static_cast<double>(r.t_ns) / opt.speed));
                if (due > now) break;
            }
            if (result.ordered && r.kind == RecordKind::data && !others_answered(r.connection)) {
                if (waiting_since == Clock::time_point{}) waiting_since = now;
                if (now - waiting_since < std::chrono::duration<double>(opt.order_wait_s)) break;
                ++result.order_timeouts;
            }
            waiting_since = {};
            ++next;
            if (r.kind == RecordKind::reply) continue;  // production's answer, not input
            if (r.kind == RecordKind::open) {
                ReplayConnection& c = conns[r.connection];
                ++result.connections;
                c.fd = start_connect(opt.to);
                if (!c.fd) {
                    ++result.connect_failures;
                    c.done = true;
                }
                continue;
            }
            auto it = conns.find(r.connection);
            if (it == conns.end() || it->second.done) continue;
            if (r.kind == RecordKind::data) {
                ReplayConnection& c = it->second;
                c.out.append(r.bytes);
                if (c.sent_framer) {
                    c.scratch.clear();
                    c.sent_framer->feed({reinterpret_cast<const std::uint8_t*>(r.bytes.data()), r.bytes.size()},
                                        c.scratch);
                    c.requests_sent += c.scratch.size();
                }
            } else {
                it->second.ended = true;
            }
        }
        if (next == records.size() && drain_deadline == Clock::time_point{})
            drain_deadline = Clock::now() + std::chrono::milliseconds(static_cast<long>(opt.drain_timeout_s * 1000));

        std::vector<pollfd> fds;
        std::vector<ReplayConnection*> owners;
        for (auto& [id, c] : conns) {
            if (c.done) continue;
            short events = POLLIN;
            if (!c.connected || c.offset < c.out.size()) events |= POLLOUT;
            fds.push_back({c.fd.get(), events, 0});
            owners.push_back(&c);
        }
        if (fds.empty() && next == records.size()) break;
        if (next == records.size() && Clock::now() >= drain_deadline) {
            result.unfinished = fds.size();
            break;
        }
        int timeout_ms = 100;
        if (next < records.size() && opt.speed > 0) {
            const auto due = start + std::chrono::nanoseconds(static_cast<std::int64_t>(static_cast<double>(records[next].t_ns) / opt.speed));
            timeout_ms = static_cast<int>(std::clamp<std::int64_t>(
                std::chrono::duration_cast<std::chrono::milliseconds>(due - Clock::now()).count(), 0, 100));
        } else if (next < records.size()) {
            timeout_ms = waiting_since == Clock::time_point{} ? 0 : 5;  // waiting for replies: poll wakes for them
        }
        ::poll(fds.data(), fds.size(), timeout_ms);
        for (std::size_t i = 0; i < fds.size(); ++i) {
            ReplayConnection& c = *owners[i];
            const short rev = fds[i].revents;
            if (!rev) continue;
            if (!c.connected && (rev & (POLLOUT | POLLERR | POLLHUP))) {
                int err = 0;
                socklen_t len = sizeof err;
                ::getsockopt(c.fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
                if (err) {
                    ++result.connect_failures;
                    c.done = true;
                    c.fd.reset();
                    continue;
                }
                c.connected = true;
            }
            if (c.connected && c.offset < c.out.size() && (rev & POLLOUT)) {
                const ssize_t w = ::send(c.fd.get(), c.out.data() + c.offset, c.out.size() - c.offset, MSG_NOSIGNAL | MSG_DONTWAIT);
                if (w > 0) {
                    c.offset += static_cast<std::size_t>(w);
                    result.bytes_sent += static_cast<std::uint64_t>(w);
                } else if (w < 0 && errno != EAGAIN && errno != EINTR) {
                    ++result.send_failures;
                    c.done = true;
                    c.fd.reset();
                    continue;
                }
                if (c.offset == c.out.size()) {
                    c.out.clear();
                    c.offset = 0;
                }
            }
            if (rev & (POLLIN | POLLHUP | POLLERR)) {
                const ssize_t n = ::recv(c.fd.get(), buf, sizeof buf, MSG_DONTWAIT);
                if (n > 0) {
                    result.bytes_received += static_cast<std::uint64_t>(n);
                    if (c.check) c.check->reply({reinterpret_cast<const std::uint8_t*>(buf), static_cast<std::size_t>(n)});
                }
                if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
                    if (c.check) c.check->finish(n == 0);
                    c.done = true;
                    c.fd.reset();
                    continue;
                }
            }
        }
        for (auto& [id, c] : conns) {
            if (!c.done && c.connected && c.ended && !c.shut && c.offset == c.out.size()) {
                ::shutdown(c.fd.get(), SHUT_WR);
                c.shut = true;
            }
        }
    }
    result.elapsed_s = std::chrono::duration<double>(Clock::now() - start).count();
    classify_differences(differences, result.comparison);
    for (auto& [id, c] : conns)
        if (c.check) c.check->finish(false);
    return result;
}

std::string to_json(const ReplayResult& r) {
    JsonWriter j;
    j.begin_object();
    j.field("connections", r.connections);
    j.field("connect_failures", r.connect_failures);
    j.field("send_failures", r.send_failures);
    j.field("bytes_sent", r.bytes_sent);
    j.field("bytes_received", r.bytes_received);
    j.field("unfinished", r.unfinished);
    j.field("ordered", r.ordered);
    j.field("order_timeouts", r.order_timeouts);
    j.field("recorded_s", r.recorded_s);
    j.field("elapsed_s", r.elapsed_s);
    j.key("comparison").begin_object();
    write_divergence_fields(j, r.comparison, CompareSource::replay);
    j.end_object();
    j.end_object();
    return j.str();
}

std::string comparison_summary(const DivergenceStats& c) {
    std::string out = "replies compared with production's (" + c.mode + "): " + std::to_string(c.compared) +
                      (c.mode == "stream" ? " bytes matched, " : " compared, ") + std::to_string(c.mismatches) +
                      " differ on " + std::to_string(c.diverged_connections) + " connection(s)";
    if (c.ignored) out += ", " + std::to_string(c.ignored) + " ignored";
    if (c.unchecked_connections) out += ", " + std::to_string(c.unchecked_connections) + " connection(s) not comparable";
    for (const auto& r : c.reports)
        out += "\n  connection " + std::to_string(r.connection) + (r.index_is_byte_offset ? ", byte " : ", reply ") +
               std::to_string(r.index) + (r.request.empty() ? "" : " to '" + printable(r.request) + "'") +
               ": production \"" + printable(r.production, 80) + "\", replay \"" + printable(r.debug, 80) + "\"";
    return out;
}

}  // namespace iprobe::proxy
