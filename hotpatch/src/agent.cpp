#include "iprobe/hotpatch/agent.h"

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <map>
#include <memory>
#include <set>

#include "iprobe/support/error.h"

namespace iprobe::hotpatch {
namespace {

// Writes one message line whole (blocking: a slow reader slows the trace,
// whose losses the target's rings count).  False once the reader is gone.
bool send_line(int fd, const std::string& text) {
    std::string line = text + "\n";
    std::size_t done = 0;
    while (done < line.size()) {
        // A socket's reader gone is EPIPE, not SIGPIPE (a pipe's is the caller's to ignore).
        ssize_t n = ::send(fd, line.data() + done, line.size() - done, MSG_NOSIGNAL);
        if (n < 0 && errno == ENOTSOCK) n = ::write(fd, line.data() + done, line.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        done += static_cast<std::size_t>(n);
    }
    return true;
}

bool alive(pid_t pid) { return ::kill(pid, 0) == 0 || errno == EPERM; }

// The agent's state: its sources, loaded once, each function's probes in
// them, and what is on.
class Agent {
public:
    Agent(const AgentOptions& options, int out_fd) : options_(options), out_(out_fd) {}

    bool send(const agent::Message& m) { return send_line(out_, agent::encode(m)); }

    agent::Reply handle(const agent::Request& request) {
        agent::Reply reply;
        reply.id = request.id;
        try {
            std::visit([&](const auto& body) { apply(body, reply); }, request.body);
        } catch (const Error& e) {
            reply.ok = false;
            reply.error = e.what();
            reply.exit_code = static_cast<int>(e.code());
        }
        return reply;
    }

    // Sends what the rings hold now; false when the reader is gone.
    bool pump_trace() {
        if (!reader_) return true;
        bool ok = true;
        last_drained_ = reader_->drain([&](const Event& e) {
            if (!ok) return;
            nesting_.records(e, reader_->probe(e.probe), [&](const TraceRecord& r) {
                if (!ok) return;
                ok = send(r);
                ++records_;
            });
        });
        return ok;
    }

    bool tracing() const { return reader_ != nullptr; }

    // How long to wait for a request before pumping the trace again.
    std::chrono::microseconds next_pump() const {
        return reader_ ? reader_->pause_after(last_drained_) : std::chrono::microseconds(200000);
    }

    bool end_trace() {
        if (!reader_) return true;
        const bool ok = pump_trace() && send(agent::TraceEnd{records_, reader_->take_dropped()});
        reader_.reset();
        return ok;
    }

private:
    // The sources, loaded at the first request that needs them (a session
    // that only patches never does), and each function's probes in them.
    void load_sources() {
        if (!lists_.empty()) return;
        std::vector<std::string> sources = options_.probe_sources;
        if (sources.empty()) {
            std::error_code ec;
            const auto exe = std::filesystem::read_symlink("/proc/" + std::to_string(options_.pid) + "/exe", ec);
            if (ec)
                throw Error("no process " + std::to_string(options_.pid) + " (or its executable cannot be read)",
                            ExitCode::not_found);
            sources.push_back(exe.string());
        }
        lists_ = select_probes(sources, probelist::ProbeSelector{});
        for (std::size_t l = 0; l < lists_.size(); ++l)
            for (const probelist::Probe& p : lists_[l].list->probes) {
                auto [it, fresh] = probes_of_.try_emplace(p.function);
                if (fresh) order_.push_back(p.function);
                it->second.push_back({l, p.id});
            }
    }

    // The probes of `functions` in each list (all of them when empty).
    std::vector<ProbeSelection> selection_of(const std::vector<std::string>& functions) {
        load_sources();
        std::vector<ProbeSelection> out;
        for (const auto& l : lists_) out.push_back({l.source, l.list, {}});
        for (const std::string& f : functions.empty() ? order_ : functions) {
            const auto it = probes_of_.find(f);
            if (it == probes_of_.end())
                throw Error("no probe of function " + f + " in " + lists_.front().source +
                                (lists_.size() > 1 ? " and the other sources" : ""),
                            ExitCode::not_found);
            for (const auto& [list, id] : it->second) out[list].probes.push_back(id);
        }
        std::erase_if(out, [](const ProbeSelection& s) { return s.probes.empty(); });
        return out;
    }

    AttachStats attach(const std::vector<std::string>& functions, const agent::Attach* how = nullptr) {
        AttachOptions o = options_.attach;
        o.pid = options_.pid;
        if (how && how->handler) o.mode = *how->handler;
        if (how && how->completed) {
            if (o.mode != HandlerMode::count)
                throw Error("completed is for the count handler (trace keeps completed calls and times anyway)",
                            ExitCode::usage);
            o.count_exits = true;
        }
        // Values and the condition: the request's, else the agent's own.
        if (how && how->values.any()) {
            o.values = how->values;
            o.retval_histogram = how->values.retval;  // as `iprobe attach --retval`
        }
        if (how && !how->when.empty()) o.when = how->when;
        if (how && !how->min_duration.empty()) o.min_duration = how->min_duration;
        if ((o.values.any() || !o.when.empty() || !o.min_duration.empty()) && o.mode != HandlerMode::trace)
            throw Error("--args, --retval, --backtrace, --when and --min-duration need the trace handler",
                        ExitCode::usage);
        o.selections = selection_of(functions);  // loads the sources: order_ is known after
        const AttachStats st = hotpatch::attach(o);
        for (const auto& f : functions.empty() ? order_ : functions)
            if (on_set_.insert(f).second) on_.push_back(f);
        return st;
    }

    DetachStats detach(const std::vector<std::string>& functions) {
        if (functions.empty()) return {};  // an empty selection would mean every probe
        DetachOptions o;
        o.pid = options_.pid;
        o.safe_point_timeout = options_.attach.safe_point_timeout;
        o.selections = selection_of(functions);
        const DetachStats st = hotpatch::detach(o);
        for (const auto& f : functions) on_set_.erase(f);
        std::erase_if(on_, [&](const std::string& f) { return !on_set_.count(f); });
        return st;
    }

    void apply(const agent::Attach& a, agent::Reply& r) { r.attached = attach(a.functions, &a); }
    void apply(const agent::Detach& d, agent::Reply& r) { r.detached = detach(d.functions); }
    void apply(const agent::Select& s, agent::Reply& r) {
        const std::set<std::string> wanted(s.functions.begin(), s.functions.end());
        std::vector<std::string> off, on;
        for (const auto& f : on_)
            if (!wanted.count(f)) off.push_back(f);
        for (const auto& f : s.functions)
            if (!on_set_.count(f)) on.push_back(f);
        if (!off.empty()) r.detached = detach(off);
        if (!on.empty()) r.attached = attach(on);
    }
    void apply(const agent::Status&, agent::Reply& r) {
        r.status = agent::AgentStatus{options_.pid, on_, tracing(), records_};
    }
    void apply(const agent::Patch& p, agent::Reply& r) {
        PatchOptions o;
        o.pid = options_.pid;
        o.patches = p.patches;
        o.force = p.force;
        o.safe_point_timeout = options_.attach.safe_point_timeout;
        r.patched = hotpatch::patch(o);
    }
    void apply(const agent::Trace& t, agent::Reply&) {
        if (!t.on) {
            // The TraceEnd follows the reply (see serve_agent).
            stop_requested_ = true;
            return;
        }
        if (!reader_) reader_ = std::make_unique<TraceReader>(options_.pid, TraceReader::Access::stream);
        reader_->set_lossless(t.lossless);  // off again when the reader goes (end_trace)
    }

public:
    bool stop_requested_ = false;

private:
    const AgentOptions& options_;
    int out_;
    std::vector<ProbeSelection> lists_;
    std::map<std::string, std::vector<std::pair<std::size_t, std::uint32_t>>> probes_of_;  // function -> (list, id)
    std::vector<std::string> order_;  // every function, in list order
    std::vector<std::string> on_;
    std::set<std::string> on_set_;
    std::unique_ptr<TraceReader> reader_;
    CallNesting nesting_;
    std::uint64_t records_ = 0;
    std::size_t last_drained_ = 0;
};

}  // namespace

int serve_agent(const AgentOptions& options, int in_fd, int out_fd) {
    Agent agent(options, out_fd);
    std::string partial;
    char buf[65536];
    for (;;) {
        if (interrupted()) {
            agent.end_trace();
            return static_cast<int>(ExitCode::interrupted);
        }
        if (!alive(options.pid)) {
            agent.end_trace();
            agent.send(agent::Exit{"process " + std::to_string(options.pid) + " exited"});
            return 0;
        }
        pollfd p{in_fd, POLLIN, 0};
        const auto wait = agent.next_pump();
        const timespec timeout{static_cast<time_t>(wait.count() / 1000000), static_cast<long>(wait.count() % 1000000) * 1000};
        const int ready = ::ppoll(&p, 1, &timeout, nullptr);
        if (ready < 0 && errno != EINTR) throw_errno("ppoll");
        if (ready > 0) {
            const ssize_t n = ::read(in_fd, buf, sizeof buf);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) {
                agent.end_trace();
                return 0;
            }
            partial.append(buf, static_cast<std::size_t>(n));
            std::size_t start = 0;
            for (std::size_t nl; (nl = partial.find('\n', start)) != std::string::npos; start = nl + 1) {
                const std::string_view line(partial.data() + start, nl - start);
                agent::Reply reply;
                try {
                    reply = agent.handle(agent::decode_request(line));
                } catch (const Error& e) {  // not a request: said, and the next line read
                    reply.ok = false;
                    reply.error = e.what();
                    reply.exit_code = static_cast<int>(e.code());
                }
                if (!agent.send(reply)) return 0;
                if (agent.stop_requested_) {
                    agent.stop_requested_ = false;
                    if (!agent.end_trace()) return 0;
                }
            }
            partial.erase(0, start);
            if (partial.size() > (1u << 24)) throw Error("a probe agent request longer than 16 MiB", ExitCode::bad_input);
        }
        if (!agent.pump_trace()) return 0;
    }
}

AgentClient::AgentClient(UniqueFd channel, std::chrono::milliseconds reply_timeout)
    : to_(::dup(channel.get())), from_(std::move(channel)), timeout_(reply_timeout) {
    if (!to_) throw_errno("dup");
}

AgentClient::AgentClient(UniqueFd to_agent, UniqueFd from_agent, std::chrono::milliseconds reply_timeout)
    : to_(std::move(to_agent)), from_(std::move(from_agent)), timeout_(reply_timeout) {}

void AgentClient::receive(const std::string& line) {
    agent::Message m = agent::decode_message(line);
    if (auto* r = std::get_if<agent::Reply>(&m)) replies_.push_back(std::move(*r));
    else if (auto* t = std::get_if<TraceRecord>(&m)) trace_.push_back(std::move(*t));
    else if (auto* e = std::get_if<agent::TraceEnd>(&m)) dropped_ += e->dropped;
    else if (auto* x = std::get_if<agent::Exit>(&m)) {
        alive_ = false;
        target_exited_ = true;
        exit_reason_ = x->reason;
    }
}

bool AgentClient::read_some(int timeout_ms) {
    if (!from_) return false;
    pollfd p{from_.get(), POLLIN, 0};
    const int ready = ::poll(&p, 1, timeout_ms);
    if (ready <= 0) return ready == 0 || errno == EINTR;
    char buf[65536];
    const ssize_t n = ::read(from_.get(), buf, sizeof buf);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
    if (n <= 0) {
        alive_ = false;
        if (exit_reason_.empty()) exit_reason_ = "its channel closed";
        from_.reset();
        return false;
    }
    partial_.append(buf, static_cast<std::size_t>(n));
    std::size_t start = 0;
    for (std::size_t nl; (nl = partial_.find('\n', start)) != std::string::npos; start = nl + 1)
        receive(partial_.substr(start, nl - start));
    partial_.erase(0, start);
    return true;
}

bool AgentClient::pump() {
    while (from_) {
        pollfd p{from_.get(), POLLIN, 0};
        if (::poll(&p, 1, 0) <= 0) break;
        if (!read_some(0)) break;
    }
    return alive_;
}

std::vector<TraceRecord> AgentClient::take_trace() {
    std::vector<TraceRecord> out(std::make_move_iterator(trace_.begin()), std::make_move_iterator(trace_.end()));
    trace_.clear();
    return out;
}

agent::Reply AgentClient::call(const agent::RequestBody& body) {
    const agent::Request request{next_id_++, body};
    if (!alive_ || !send_line(to_.get(), agent::encode(request)))
        throw Error("the probe agent is gone (" + (exit_reason_.empty() ? std::string("its channel closed") : exit_reason_) + ")");
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    for (;;) {
        for (auto it = replies_.begin(); it != replies_.end(); ++it)
            if (it->id == request.id) {
                agent::Reply r = std::move(*it);
                replies_.erase(it);
                if (!r.ok) throw Error(r.error, static_cast<ExitCode>(r.exit_code));
                return r;
            }
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
        if (left.count() <= 0)
            throw Error("the probe agent did not answer within " + std::to_string(timeout_.count() / 1000) + " s");
        if (!read_some(static_cast<int>(std::min<long long>(left.count(), 200))) && !from_)
            throw Error("the probe agent is gone (" + exit_reason_ + ")");
    }
}

}  // namespace iprobe::hotpatch
