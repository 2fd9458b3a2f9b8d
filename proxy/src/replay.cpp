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
#include "iprobe/support/error.h"

namespace iprobe::proxy {

namespace {

using Clock = std::chrono::steady_clock;

struct ReplayConnection {
    UniqueFd fd;
    bool connected = false;
    std::string out;
    std::size_t offset = 0;
    bool ended = false;      // the recorded client closed: shut down after sending
    bool shut = false;
    bool done = false;       // the service closed too (or failed)
};

}  // namespace

ReplayResult run_replay(const ReplayOptions& opt) {
    const std::vector<Record> records = read_recording(opt.path);
    ::signal(SIGPIPE, SIG_IGN);
    ReplayResult result;
    if (!records.empty()) result.recorded_s = static_cast<double>(records.back().t_ns) / 1e9;

    std::map<std::uint32_t, ReplayConnection> conns;
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
                if (n > 0) result.bytes_received += static_cast<std::uint64_t>(n);
                if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
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
    return result;
}

}  // namespace iprobe::proxy
