// Requests and the two reply streams to them, matched in order: side 0 is
// the reference (production, or a recording of it), side 1 the copy.  Shared
// by the mirror's debug legs and `iprobe replay --compare`.  Private to the
// proxy library.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <utility>

#include "iprobe/proxy/framing.h"

namespace iprobe::proxy {

struct ReplyQueues {
    std::deque<Message> requests, replies[2];
    std::deque<std::chrono::steady_clock::time_point> reference_at;  // when each waiting reference reply arrived
    std::uint64_t index = 0;                     // replies matched so far

    // Pops every matched pair; `on_pair(index, request, reference, copy,
    // reference_at)` for each one whose request is not ignored by `rules`
    // (reference_at: when the reference reply arrived, if kept).  Returns
    // the number of ignored pairs.
    template <typename OnPair>
    std::uint64_t match(const DivergenceRules& rules, OnPair&& on_pair) {
        std::uint64_t ignored = 0;
        while (!replies[0].empty() && !replies[1].empty()) {
            Message ref = std::move(replies[0].front());
            Message copy = std::move(replies[1].front());
            replies[0].pop_front();
            replies[1].pop_front();
            std::chrono::steady_clock::time_point ref_at{};
            if (!reference_at.empty()) {
                ref_at = reference_at.front();
                reference_at.pop_front();
            }
            Message req;
            if (!requests.empty()) {
                req = std::move(requests.front());
                requests.pop_front();
            }
            const std::uint64_t at = index++;
            if (!req.verb.empty() && rules.ignores_command(req.verb)) {
                ++ignored;
                continue;
            }
            on_pair(at, req, ref, copy, ref_at);
        }
        return ignored;
    }
    void clear() {
        requests.clear();
        replies[0].clear();
        replies[1].clear();
        reference_at.clear();
    }
};

}  // namespace iprobe::proxy
