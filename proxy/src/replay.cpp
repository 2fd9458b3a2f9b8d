#include "iprobe/proxy/replay.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <signal.h>
#include <vector>

#include "iprobe/proxy/recording.h"
#include "iprobe/proxy/stream_compare.h"
#include "iprobe/support/error.h"
#include "iprobe/support/json.h"
#include "reply_queues.h"

namespace iprobe::proxy {

namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kMaxReports = 100;

// The service's replies on one replayed connection against production's, as
// recorded.  Everything production sent is known up front, so it is framed
// (and the requests with it) before the first byte goes out.
class ReplyCheck {
public:
    ReplyCheck(std::uint32_t connection, const ReplayOptions& opt, DivergenceStats& out)
        : connection_(connection), opt_(opt), out_(out) {
        if (opt.compare == Protocol::stream) {
            stream_ = std::make_unique<StreamComparer>(std::size_t(64) << 20);
        } else {
            request_framer_ = Framer::create(opt.compare, Role::request, opt.rules);
            framer_[0] = Framer::create(opt.compare, Role::response, opt.rules);
            framer_[1] = Framer::create(opt.compare, Role::response, opt.rules);
        }
    }
    void request(const std::string& bytes) {
        if (!request_framer_ || failed_) return;
        scratch_.clear();
        request_framer_->feed(as_span(bytes), scratch_);
        if (request_framer_->failed()) return fail();
        for (auto& m : scratch_) {
            framer_[0]->expect(m);
            framer_[1]->expect(m);
            queues_.requests.push_back(std::move(m));
        }
    }
    void recorded_reply(const std::string& bytes) {
        saw_reference_ = true;
        feed(0, as_span(bytes));
    }
    void reply(std::span<const std::uint8_t> bytes) { feed(1, bytes); }
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
        for (auto& m : scratch_) queues_.replies[side].push_back(std::move(m));
        match();
    }
    void match() {
        out_.ignored += queues_.match(opt_.rules, [&](std::uint64_t index, const Message& req, const Message& ref,
                                                      const Message& copy) {
            ++out_.compared;
            if (ref.hash != copy.hash) report(index, req.summary, ref.excerpt, copy.excerpt);
        });
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
    void fail() {
        if (failed_) return;
        failed_ = true;
        ++out_.unchecked_connections;
    }

    std::uint32_t connection_;
    const ReplayOptions& opt_;
    DivergenceStats& out_;
    std::unique_ptr<Framer> request_framer_, framer_[2];
    std::unique_ptr<StreamComparer> stream_;
    ReplyQueues queues_;
    std::vector<Message> scratch_;
    bool saw_reference_ = false, reported_ = false, failed_ = false, done_ = false;
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
};

}  // namespace

ReplayResult run_replay(const ReplayOptions& opt) {
    const std::vector<Record> records = read_recording(opt.path);
    ::signal(SIGPIPE, SIG_IGN);
    ReplayResult result;
    if (!records.empty()) result.recorded_s = static_cast<double>(records.back().t_ns) / 1e9;

    std::map<std::uint32_t, ReplayConnection> conns;
    result.comparison.mode = protocol_name(opt.compare);
    if (opt.compare != Protocol::off) {
        // Production's side of every connection, framed before anything is sent.
        for (const Record& r : records) {
            if (r.kind == RecordKind::open) {
                conns[r.connection].check = std::make_unique<ReplyCheck>(r.connection, opt, result.comparison);
                continue;
            }
            auto it = conns.find(r.connection);
            if (it == conns.end()) continue;
            if (r.kind == RecordKind::data) it->second.check->request(r.bytes);
            if (r.kind == RecordKind::reply) it->second.check->recorded_reply(r.bytes);
        }
    }
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
                it->second.out.append(r.bytes);
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
            timeout_ms = 0;
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
