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

// Byte for byte: side 0 production's replies, 1 the copy's.  The bytes
// found equal are counted as they are (`compared`, bytes in this mode, up to
// the first difference), so a stream checked and found equal says so.
void DebugLeg::compare_stream(int side, std::span<const std::uint8_t> bytes) {
    const std::uint64_t matched_before = stream_->matched();
    const auto r = stream_->feed(side, bytes);
    px_.stats.compared += stream_->matched() - matched_before;
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
                                                          const Message& dbg, Clock::time_point prod_at) {
        ++px_.stats.compared;
        if (prod.hash == dbg.hash) return;
        ReorderClassifier::Mismatch m;
        m.connection = owner_.id();
        m.target = target_;
        m.request = req.hash;
        m.production = prod.hash;
        m.copy = dbg.hash;
        m.production_at = prod_at;
        m.seen_at = Clock::now();
        m.index = index;
        m.request_text = req.summary;
        m.production_excerpt = prod.excerpt;
        m.copy_excerpt = dbg.excerpt;
        px_.reorders.add(std::move(m));
    });
}

void DebugLeg::report(std::uint64_t index, const std::string& request, const std::string& prod, const std::string& dbg) {
    reported_ = true;
    px_.diverged(owner_.id(), target_, index, request, prod, dbg);
}

void Proxy::diverged(std::uint32_t connection, std::uint32_t target, std::uint64_t index, const std::string& request,
                     const std::string& prod, const std::string& dbg) {
    ++stats.mismatches;
    if (!stats.diverged_legs.insert({connection, target}).second) {
        // Past a connection's first difference only where every one is asked
        // for (what `iprobe debug --patch` shows).
        if (opt.rules.every_difference && stats.reports.size() < kMaxReports)
            stats.reports.push_back({connection, index, request, prod, dbg, ms_since(stats.started), target});
        return;
    }
    ++stats.diverged_connections;
    ++stats.targets[target].diverged_connections;
    const char* unit = opt.divergence == Protocol::stream ? "byte offset" : "reply";
    rate_limited_log(stats.diverged_connections,
                     "divergence on connection %u (debug copy %s), %s %llu%s%s%s: production \"%s\", debug copy \"%s\"",
                     connection, opt.debug[target].str().c_str(), unit, static_cast<unsigned long long>(index),
                     request.empty() ? "" : " to '", printable(request).c_str(), request.empty() ? "" : "'",
                     printable(prod, 80).c_str(), printable(dbg, 80).c_str());
    if (stats.reports.size() < kMaxReports)
        stats.reports.push_back({connection, index, request, prod, dbg, ms_since(stats.started), target});
}

std::uint64_t ReorderClassifier::key(std::uint32_t target, std::uint64_t request, std::uint64_t reply) {
    return (request * 0x9e3779b97f4a7c15ULL) ^ (reply + 0x632be59bd9b4e019ULL + (std::uint64_t(target) << 48));
}

void ReorderClassifier::add(Mismatch m) {
    by_production_.emplace(key(m.target, m.request, m.production), first_id_ + list_.size());
    list_.push_back(std::move(m));
    ++pending_;
}

void ReorderClassifier::classify(Clock::time_point now, bool all) {
    for (std::size_t i = 0; i < list_.size(); ++i) {
        Mismatch& m = list_[i];
        if (m.classified) continue;
        if (!all && now - m.seen_at < kSettle) break;  // later ones are younger still
        m.classified = true;
        --pending_;
        bool explained = false;
        const auto [from, to] = by_production_.equal_range(key(m.target, m.request, m.copy));
        for (auto it = from; it != to && !explained; ++it) {
            Mismatch& p = list_[static_cast<std::size_t>(it->second - first_id_)];
            if (&p == &m || p.claimed || p.target != m.target || p.request != m.request || p.production != m.copy)
                continue;
            const auto apart = p.production_at > m.production_at ? p.production_at - m.production_at
                                                                 : m.production_at - p.production_at;
            if (apart > kWindow) continue;
            p.claimed = explained = true;
        }
        if (explained) ++px_.stats.reordered;
        else px_.diverged(m.connection, m.target, m.index, m.request_text, m.production_excerpt, m.copy_excerpt);
    }
    // Forget what no later difference can pair with any more.
    while (!list_.empty() && list_.front().classified &&
           (all || now - list_.front().seen_at > kSettle + 2 * kWindow)) {
        const Mismatch& m = list_.front();
        const auto [from, to] = by_production_.equal_range(key(m.target, m.request, m.production));
        for (auto it = from; it != to; ++it)
            if (it->second == first_id_) {
                by_production_.erase(it);
                break;
            }
        list_.pop_front();
        ++first_id_;
    }
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
