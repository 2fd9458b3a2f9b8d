#include "iprobe/hotpatch/exit_marks.h"

#include <algorithm>
#include <cstring>

namespace iprobe::hotpatch {

namespace {

constexpr std::uint64_t kCounter = 0xffff;
constexpr std::uint16_t kMarks = IPROBE_RT_EXIT_MARKS;

std::uint16_t written_of(std::uint64_t state) { return static_cast<std::uint16_t>(state & kCounter); }
std::uint16_t taken_of(std::uint64_t state) { return static_cast<std::uint16_t>(state >> 16 & kCounter); }

// `from` added to `into`: its count kept, at the later instant, the
// function named only when both name the same.
void merge(iprobe_rt_exit_mark& into, const iprobe_rt_exit_mark& from) {
    into.count += from.count;
    into.at = std::max(into.at, from.at);
    if (into.probe != from.probe) into.probe = IPROBE_RT_EXIT_MARK_ANY;
}

iprobe_rt_exit_mark raw(const ExitMark& m) { return {m.at, m.count, m.tid, m.probe}; }

}  // namespace

void add_exit_marks(iprobe_rt_exit_marks& queue, std::span<const ExitMark> marks) {
    if (marks.empty()) return;
    std::uint64_t state = __atomic_load_n(&queue.state, __ATOMIC_ACQUIRE);
    while (!__atomic_compare_exchange_n(&queue.state, &state, state | IPROBE_RT_EXIT_MARKS_WRITING, false,
                                        __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    }
    // Readers cannot take any now (their CAS expects the word unmarked).
    const std::uint16_t pending =
        std::min<std::uint16_t>(static_cast<std::uint16_t>(written_of(state) - taken_of(state)), kMarks);
    std::vector<iprobe_rt_exit_mark> queued;  // oldest first
    for (std::uint16_t i = 0; i < pending; i++)
        queued.push_back(queue.mark[static_cast<std::uint16_t>(written_of(state) - pending + i) % kMarks]);
    for (const ExitMark& m : marks) {
        if (queued.size() < kMarks) {
            queued.push_back(raw(m));
            continue;
        }
        const auto same = std::find_if(queued.rbegin(), queued.rend(), [&](const auto& q) { return q.tid == m.tid; });
        if (same != queued.rend()) {
            merge(*same, raw(m));
            continue;
        }
        // None of this thread's (the slot's earlier threads' marks, never
        // taken): two of one thread become one, else the two oldest.
        std::size_t older = 0, newer = 1;
        bool found = false;
        for (std::size_t i = 0; i + 1 < queued.size() && !found; i++)
            for (std::size_t j = i + 1; j < queued.size() && !found; j++)
                if (queued[i].tid == queued[j].tid) older = i, newer = j, found = true;
        merge(queued[newer], queued[older]);
        queued.erase(queued.begin() + static_cast<std::ptrdiff_t>(older));
        queued.push_back(raw(m));
    }
    const auto first = static_cast<std::uint16_t>(written_of(state) - pending);
    for (std::size_t i = 0; i < queued.size(); i++) queue.mark[static_cast<std::uint16_t>(first + i) % kMarks] = queued[i];
    const auto written = static_cast<std::uint16_t>(first + queued.size());
    const std::uint64_t changes = (state >> 32 & 0x7fffffff) + 1;
    __atomic_store_n(&queue.state, written | std::uint64_t{first} << 16 | (changes & 0x7fffffff) << 32, __ATOMIC_RELEASE);
}

std::vector<ExitMark> take_exit_marks(iprobe_rt_exit_marks& queue) {
    for (int attempt = 0; attempt < 8; attempt++) {
        std::uint64_t state = __atomic_load_n(&queue.state, __ATOMIC_ACQUIRE);
        if (state & IPROBE_RT_EXIT_MARKS_WRITING) return {};
        const std::uint16_t written = written_of(state);
        const std::uint16_t pending = std::min<std::uint16_t>(static_cast<std::uint16_t>(written - taken_of(state)), kMarks);
        if (pending == 0) return {};
        std::vector<ExitMark> out;
        for (std::uint16_t i = 0; i < pending; i++) {
            iprobe_rt_exit_mark m;
            std::memcpy(&m, const_cast<const iprobe_rt_exit_mark*>(&queue.mark[static_cast<std::uint16_t>(written - pending + i) % kMarks]),
                        sizeof m);
            out.push_back({m.tid, m.probe, m.at, m.count});
        }
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        const std::uint64_t taken = (state & ~(kCounter << 16)) | std::uint64_t{written} << 16;
        if (__atomic_compare_exchange_n(&queue.state, &state, taken, false, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) return out;
    }
    return {};
}

void PendingExitMarks::add(const ExitMark& mark) {
    constexpr std::size_t kMaxThreads = 1u << 16, kMaxPerThread = 64;
    if (by_thread_.size() >= kMaxThreads && !by_thread_.count(mark.tid)) by_thread_.clear();
    auto& marks = by_thread_[mark.tid];
    if (marks.size() < kMaxPerThread) {
        marks.push_back(mark);
        return;
    }
    ExitMark& newest = marks.back();
    newest.count += mark.count;
    newest.at = std::max(newest.at, mark.at);
    if (newest.probe != mark.probe) newest.probe = IPROBE_RT_EXIT_MARK_ANY;
}

std::vector<ExitMark> PendingExitMarks::take(std::uint32_t tid, std::uint64_t tsc) {
    const auto it = by_thread_.find(tid);
    if (it == by_thread_.end()) return {};
    std::vector<ExitMark> out;
    auto due = [&](const ExitMark& m) { return m.at <= tsc; };
    for (const ExitMark& m : it->second)
        if (due(m)) out.push_back(m);
    if (!out.empty()) std::erase_if(it->second, due);
    if (it->second.empty()) by_thread_.erase(it);
    return out;
}

std::uint64_t PendingExitMarks::calls() const {
    std::uint64_t total = 0;
    for (const auto& [tid, marks] : by_thread_)
        for (const ExitMark& m : marks) total += m.count;
    return total;
}

}  // namespace iprobe::hotpatch
