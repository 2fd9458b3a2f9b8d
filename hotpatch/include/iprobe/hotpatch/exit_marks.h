// Where calls in flight lost their exit at a detach (rt_layout.h,
// iprobe_rt_exit_marks): the detacher adds a mark per thread and function
// in its stop; the stream reader takes them and closes those calls in the
// thread's nesting just before its first event at or after the mark's
// instant (PendingExitMarks), so what follows is nested as it ran.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "iprobe/formats/rt_layout.h"

namespace iprobe::hotpatch {

struct ExitMark {
    std::uint32_t tid = 0;
    std::uint32_t probe = IPROBE_RT_EXIT_MARK_ANY;  // an exit probe of their function (global index)
    std::uint64_t at = 0;     // the detach's stop, on the region's clock
    std::uint64_t count = 0;  // calls whose exits were lost
    bool operator==(const ExitMark&) const = default;
};

// The detacher's side, in its stop (one detacher at a time: a queue it
// finds marked as being written was left so by one killed there).  Appends
// `marks` to a thread slot's queue; a full queue coalesces (into the
// newest mark of the same thread, else two of one thread, else the two
// oldest), so no count is ever dropped.
void add_exit_marks(iprobe_rt_exit_marks& queue, std::span<const ExitMark> marks);

// The reader's side: the marks not taken yet, taken (oldest first); none
// while a detacher writes (it is in its stop: no event after its marks
// exists yet), or when another reader took them first.
std::vector<ExitMark> take_exit_marks(iprobe_rt_exit_marks& queue);

// Marks waiting for the first event of their thread at or after their
// instant (every event before it in that thread's order was read before
// the detach stopped it; one in the middle of being recorded too, since
// its clock was read before).  Bounded, as CallNesting is (the target can
// write the region, anyone a file): past 64 marks a thread's newest takes
// the next in, past 65536 threads it starts over.
class PendingExitMarks {
public:
    void add(const ExitMark& mark);
    bool empty() const { return by_thread_.empty(); }
    // The marks `tid`'s event at `tsc` comes after, taken (oldest first).
    std::vector<ExitMark> take(std::uint32_t tid, std::uint64_t tsc);
    // The calls of the marks still waiting (their threads made no event
    // after them yet).
    std::uint64_t calls() const;

private:
    std::unordered_map<std::uint32_t, std::vector<ExitMark>> by_thread_;
};

}  // namespace iprobe::hotpatch
