// Comparing the debug copy's replies with production's, message by message or byte by byte.
#include "mirror_impl.h"

namespace iprobe::proxy::mirror_impl {

void DebugLeg::check_requests(const std::uint8_t* p, std::size_t n) {
    if (!request_framer_) return;
    scratch_.clear();
    request_framer_->feed({p, n}, scratch_);
    if (request_framer_->failed()) return stop_checking("requests: " + request_framer_->error());
    for (auto& m : scratch_) {
        reply_framer_[0]->expect(m);
        reply_framer_[1]->expect(m);
        requests_.push_back(std::move(m));
    }
    if (requests_.size() > kMaxPendingMessages) stop_checking("too many requests awaiting comparison");
}

void DebugLeg::check_replies(int side, const std::uint8_t* p, std::size_t n) {
    if (stream_) {
        const auto r = stream_->feed(side, {p, n});
        if (r == StreamComparer::Result::mismatch) {
            report(stream_->mismatch_offset(), "", stream_->reference_excerpt(), stream_->copy_excerpt());
            stop_checking("");
        } else if (r == StreamComparer::Result::too_far_apart) {
            stop_checking("debug replies too far behind production's to compare");
        }
        return;
    }
    scratch_.clear();
    reply_framer_[side]->feed({p, n}, scratch_);
    if (reply_framer_[side]->failed())
        return stop_checking(std::string(side == 0 ? "production" : "debug") + " replies: " + reply_framer_[side]->error());
    for (auto& m : scratch_) replies_[side].push_back(std::move(m));
    compare_messages();
    if (replies_[side].size() > kMaxPendingMessages) stop_checking("too many replies awaiting comparison");
}

void DebugLeg::compare_messages() {
    while (checking_ && !replies_[0].empty() && !replies_[1].empty()) {
        Message prod = std::move(replies_[0].front());
        Message dbg = std::move(replies_[1].front());
        replies_[0].pop_front();
        replies_[1].pop_front();
        Message req;
        if (!requests_.empty()) {
            req = std::move(requests_.front());
            requests_.pop_front();
        }
        const std::uint64_t index = compared_index_++;
        if (!req.verb.empty() && px_.opt.rules.ignores_command(req.verb)) {
            ++px_.stats.ignored;
            continue;
        }
        ++px_.stats.compared;
        if (prod.hash != dbg.hash) report(index, req.summary, prod.excerpt, dbg.excerpt);
    }
}

void DebugLeg::report(std::uint64_t index, const std::string& request, const std::string& prod, const std::string& dbg) {
    ++px_.stats.mismatches;
    if (reported_) return;
    reported_ = true;
    ++px_.stats.diverged_connections;
    const char* unit = stream_ ? "byte offset" : "reply";
    px_.rate_limited_log(px_.stats.diverged_connections, "divergence on connection %u, %s %llu%s%s%s: production \"%s\", debug copy \"%s\"", owner_.id(), unit,
            static_cast<unsigned long long>(index), request.empty() ? "" : " to '", printable(request).c_str(),
            request.empty() ? "" : "'", printable(prod, 80).c_str(), printable(dbg, 80).c_str());
    if (px_.stats.reports.size() < kMaxReports)
        px_.stats.reports.push_back({owner_.id(), index, request, prod, dbg, ms_since(px_.stats.started)});
}

void DebugLeg::stop_checking(const std::string& why) {
    if (!checking_) return;
    checking_ = false;
    if (!why.empty()) {
        ++px_.stats.unchecked_connections;
        px_.rate_limited_log(px_.stats.unchecked_connections, "connection %u: divergence checking stopped: %s", owner_.id(),
                             why.c_str());
    }
    requests_.clear();
    replies_[0].clear();
    replies_[1].clear();
    stream_.reset();
}

}  // namespace iprobe::proxy::mirror_impl
