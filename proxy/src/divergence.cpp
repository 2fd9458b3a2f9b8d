// Comparing each debug copy's replies with production's, message by message
// or byte by byte.  The mirrored stream frames requests and production's
// replies once; each leg frames its own copy's replies and matches them.
#include "mirror_impl.h"

namespace iprobe::proxy::mirror_impl {

void MirroredStream::check_requests(const std::uint8_t* p, std::size_t n) {
    scratch_.clear();
    request_framer_->feed({p, n}, scratch_);
    if (request_framer_->failed()) return stop_framing("requests: " + request_framer_->error());
    for (const auto& m : scratch_) {
        production_framer_->expect(m);
        for (auto& leg : legs_) leg->expect(m);
    }
}

void MirroredStream::production_bytes(const std::uint8_t* p, std::size_t n) {
    if (px_.opt.divergence == Protocol::stream) {
        for (auto& leg : legs_) leg->production_bytes({p, n});
        return;
    }
    if (!framing_) return;
    scratch_.clear();
    production_framer_->feed({p, n}, scratch_);
    if (production_framer_->failed()) return stop_framing("production replies: " + production_framer_->error());
    for (const auto& m : scratch_)
        for (auto& leg : legs_) leg->production_reply(m);
}

void MirroredStream::production_ended() {
    if (!framing_) return;
    scratch_.clear();
    production_framer_->finish(scratch_);
    for (const auto& m : scratch_)
        for (auto& leg : legs_) leg->production_reply(m);
}

// Without framed requests and production's replies no leg can compare any more.
void MirroredStream::stop_framing(const std::string& why) {
    framing_ = false;
    for (auto& leg : legs_) leg->stop_checking("");
    // Counted once per connection, however many copies it feeds.
    if (!why.empty()) {
        ++px_.stats.unchecked_connections;
        px_.rate_limited_log(px_.stats.unchecked_connections, "connection %u: divergence checking stopped: %s", id_,
                             why.c_str());
    }
    request_framer_.reset();
    production_framer_.reset();
}

void DebugLeg::expect(const Message& request) {
    if (!checking_) return;
    reply_framer_->expect(request);
    queues_.requests.push_back(request);
    if (queues_.requests.size() > kMaxPendingMessages) stop_checking("too many requests awaiting comparison");
}

void DebugLeg::production_reply(const Message& reply) {
    if (!checking_) return;
    queues_.replies[0].push_back(reply);
    queues_.reference_at.push_back(Clock::now());
    compare();
    if (queues_.replies[0].size() > kMaxPendingMessages) stop_checking("too many replies awaiting comparison");
}

void DebugLeg::production_bytes(std::span<const std::uint8_t> bytes) {
    if (checking_ && stream_) compare_stream(0, bytes);
}

// Byte for byte: side 0 production's replies, 1 the copy's.
void DebugLeg::compare_stream(int side, std::span<const std::uint8_t> bytes) {
    const auto r = stream_->feed(side, bytes);
    if (r == StreamComparer::Result::mismatch) {
        report(stream_->mismatch_offset(), "", stream_->reference_excerpt(), stream_->copy_excerpt());
        stop_checking("");
    } else if (r == StreamComparer::Result::too_far_apart) {
        stop_checking("debug replies too far behind production's to compare");
    }
}

void DebugLeg::copy_replies(std::span<const std::uint8_t> bytes) {
    if (stream_) return compare_stream(1, bytes);
    scratch_.clear();
    reply_framer_->feed(bytes, scratch_);
    if (reply_framer_->failed()) return stop_checking("debug replies: " + reply_framer_->error());
    for (auto& m : scratch_) queues_.replies[1].push_back(std::move(m));
    compare();
    if (queues_.replies[1].size() > kMaxPendingMessages) stop_checking("too many replies awaiting comparison");
}

void DebugLeg::compare() {
    if (!checking_) return;
    px_.stats.ignored += queues_.match(px_.opt.rules, [&](std::uint64_t index, const Message& req, const Message& prod,
                                                          const Message& dbg) {
        ++px_.stats.compared;
        if (prod.hash != dbg.hash) report(index, req.summary, prod.excerpt, dbg.excerpt);
    });
}

void DebugLeg::report(std::uint64_t index, const std::string& request, const std::string& prod, const std::string& dbg) {
    ++px_.stats.mismatches;
    if (reported_) {
        if (px_.opt.rules.every_difference && px_.stats.reports.size() < kMaxReports)
            px_.stats.reports.push_back({owner_.id(), index, request, prod, dbg, ms_since(px_.stats.started), target_});
        return;
    }
    reported_ = true;
    ++px_.stats.diverged_connections;
    ++counters().diverged_connections;
    const char* unit = stream_ ? "byte offset" : "reply";
    px_.rate_limited_log(px_.stats.diverged_connections,
                         "divergence on connection %u (debug copy %s), %s %llu%s%s%s: production \"%s\", debug copy \"%s\"",
                         owner_.id(), px_.opt.debug[target_].str().c_str(), unit, static_cast<unsigned long long>(index),
                         request.empty() ? "" : " to '", printable(request).c_str(), request.empty() ? "" : "'",
                         printable(prod, 80).c_str(), printable(dbg, 80).c_str());
    if (px_.stats.reports.size() < kMaxReports)
        px_.stats.reports.push_back({owner_.id(), index, request, prod, dbg, ms_since(px_.stats.started), target_});
}

// Both streams have ended: any reply production sent that the debug copy
// never did (or the reverse) is a divergence.
void DebugLeg::finish_checking() {
    if (!checking_) return;
    if (!reported_) {
        if (stream_ && stream_->unmatched(0) != stream_->unmatched(1)) {
            report(stream_->matched(), "", stream_->unmatched(0) ? "(more bytes)" : "(end of stream)",
                   stream_->unmatched(1) ? "(more bytes)" : "(end of stream)");
        } else if (!stream_ && queues_.replies[0].size() != queues_.replies[1].size()) {
            report(queues_.index, queues_.requests.empty() ? std::string() : queues_.requests.front().summary,
                   queues_.replies[0].empty() ? "(no reply)" : queues_.replies[0].front().excerpt,
                   queues_.replies[1].empty() ? "(no reply)" : queues_.replies[1].front().excerpt);
        }
    }
    stop_checking("");
}

void DebugLeg::stop_checking(const std::string& why) {
    if (!checking_) return;
    checking_ = false;
    if (!why.empty()) {
        ++px_.stats.unchecked_connections;
        px_.rate_limited_log(px_.stats.unchecked_connections, "connection %u: divergence checking stopped: %s",
                             owner_.id(), why.c_str());
    }
    queues_.clear();
    stream_.reset();
}

}  // namespace iprobe::proxy::mirror_impl
