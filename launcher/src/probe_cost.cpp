#include "probe_cost.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "iprobe/hotpatch/hotpatch.h"
#include "iprobe/hotpatch/trace_reader.h"
#include "iprobe/support/error.h"
#include "iprobe/support/fd.h"
#include "iprobe/support/install_layout.h"
#include "process.h"

namespace iprobe::launcher {
namespace {

constexpr long kCalls = 40000;             // per run; five runs per measurement
constexpr std::uint32_t kRing = 1u << 19;  // holds every event of a measurement: none dropped

// The calibration target, talked to over two pipes; killed on destruction.
class CostTarget {
public:
    explicit CostTarget(const std::string& path) {
        int in[2], out[2];
        if (::pipe2(in, O_CLOEXEC) < 0 || ::pipe2(out, O_CLOEXEC) < 0) throw_errno("pipe");
        UniqueFd in_rd(in[0]), out_wr(out[1]);
        to_.reset(in[1]);
        from_.reset(out[0]);
        pid_ = spawn({path}, out_wr.get(), -1, true, {}, in_rd.get());
    }
    ~CostTarget() {
        to_.reset();
        if (pid_ > 0) {
            ::kill(pid_, SIGKILL);
            ::waitpid(pid_, nullptr, 0);
        }
    }
    pid_t pid() const { return pid_; }
    // ns per call, the best of five runs of kCalls.
    double time_calls() {
        const std::string ask = std::to_string(kCalls) + "\n";
        if (::write(to_.get(), ask.data(), ask.size()) != static_cast<ssize_t>(ask.size()))
            throw Error("the probe cost target stopped");
        const auto answer = read_line(from_.get(), std::chrono::seconds(10), "the probe cost target");
        if (!answer) throw Error("the probe cost target stopped");
        return std::strtod(answer->c_str(), nullptr);
    }

private:
    pid_t pid_ = -1;
    UniqueFd to_, from_;
};

void attach_kind(pid_t pid, const std::string& target, probelist::ProbeKind kind) {
    hotpatch::AttachOptions o;
    o.pid = pid;
    o.probe_sources = {target};
    o.selector.function_globs = {"iprobe_cost_target"};
    o.selector.kinds = {kind};
    o.ring_records = kRing;
    hotpatch::attach(o);
}

}  // namespace

ProbeCost measure_probe_cost() {
    const auto helper = InstallLayout::current().helper("iprobe-probe-cost");
    if (!helper)
        throw Error("iprobe debug --adapt needs iprobe-probe-cost in " + InstallLayout::current().libexec().string() +
                        " (build it: cmake --build BUILD --target iprobe-probe-cost)",
                    ExitCode::unavailable);
    CostTarget target(helper->string());
    ProbeCost cost;
    cost.unprobed_ns = target.time_calls();
    attach_kind(target.pid(), helper->string(), probelist::ProbeKind::entry);
    hotpatch::TraceReader events(target.pid(), hotpatch::TraceReader::Access::stream);
    const double entry_only = target.time_calls();
    events.drain([](const hotpatch::Event&) {});  // the ring empty again: the next run logs every event too
    attach_kind(target.pid(), helper->string(), probelist::ProbeKind::exit);
    const double both = target.time_calls();
    cost.entry_ns = std::max(entry_only - cost.unprobed_ns, 0.0);
    cost.exit_ns = std::max(both - entry_only, 0.0);
    return cost;
}

}  // namespace iprobe::launcher
