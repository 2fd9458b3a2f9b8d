// The mirror's event loop: one thread, epoll, production's path first; the
// debug legs are served in batches (see mirror_impl.h, kDebugBatch).
#include "iprobe/proxy/mirror.h"

#include "capture.h"
#include "mirror_impl.h"

namespace iprobe::proxy {

namespace mirror_impl {

// Log lines must never stall the event loop (and with it production) when
// whoever holds our stderr pipe stops reading it: write only what the fd takes
// now, drop the rest.
void write_stderr_now(std::string_view text) {
    while (!text.empty()) {
        pollfd p{STDERR_FILENO, POLLOUT, 0};
        if (::poll(&p, 1, 0) != 1 || !(p.revents & POLLOUT)) return;
        const ssize_t w = ::write(STDERR_FILENO, text.data(), std::min<std::size_t>(text.size(), 4096));
        if (w <= 0) return;
        text.remove_prefix(static_cast<std::size_t>(w));
    }
}

Proxy::Proxy(const MirrorOptions& options) : opt(options) {
    ep_.reset(::epoll_create1(EPOLL_CLOEXEC));
    debug_ep_.reset(::epoll_create1(EPOLL_CLOEXEC));
    if (!ep_ || !debug_ep_) throw_errno("epoll_create1");
    epfd = ep_.get();
    debug_epfd = debug_ep_.get();

    rlimit lim{};
    if (::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
        lim.rlim_cur = lim.rlim_max;
        ::setrlimit(RLIMIT_NOFILE, &lim);
    }

    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGUSR1);
    ::sigprocmask(SIG_BLOCK, &mask, nullptr);
    ::signal(SIGPIPE, SIG_IGN);
    signals_.px = this;
    signals_.w = Watched(epfd, UniqueFd(::signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC)), &signals_);
    signals_.w.want(EPOLLIN);

    if (opt.capture) {
        capture_ = std::make_unique<Capture>(*this, *opt.capture);
    } else {
        clients_.px = this;
        clients_.kind = Acceptor::Kind::clients;
        clients_.w = Watched(epfd, listen_on(opt.listen, "--listen"), &clients_);
    }
    if (opt.debug_listen) {
        debug_clients_.px = this;
        debug_clients_.kind = Acceptor::Kind::debug_clients;
        debug_clients_.w = Watched(epfd, listen_on(*opt.debug_listen, "--debug-listen"), &debug_clients_);
    }
    if (opt.stats) {
        stats_listener_.px = this;
        stats_listener_.kind = Acceptor::Kind::stats;
        stats_listener_.w = Watched(epfd, listen_on(*opt.stats, "--stats"), &stats_listener_);
    }
    if (!opt.hook_socket.empty()) {
        hook_listener_.px = this;
        hook_listener_.kind = Acceptor::Kind::hook;
        hook_listener_.w = Watched(epfd, listen_unix(opt.hook_socket), &hook_listener_);
        hook_listener_.w.want(EPOLLIN);
    }
    if (opt.control_fd >= 0) {
        control_.px = this;
        control_.w = Watched(epfd, UniqueFd(opt.control_fd), &control_);
        ::fcntl(control_.w.fd(), F_SETFL, ::fcntl(control_.w.fd(), F_GETFL) | O_NONBLOCK);
        control_.w.want(EPOLLIN);
    }
    stats.targets.resize(opt.debug.size());
    if (!opt.record_path.empty()) recorder = std::make_shared<Recorder>(opt.record_path, kRecordQueue);
    if (clients_.w) clients_.w.want(EPOLLIN);
    if (debug_clients_.w) debug_clients_.w.want(EPOLLIN);
    if (stats_listener_.w) stats_listener_.w.want(EPOLLIN);
}

Proxy::~Proxy() {
    if (!opt.hook_socket.empty()) ::unlink(opt.hook_socket.c_str());
    connections_.clear();
    capture_.reset();
    slots_.clear();
    stats_clients_.clear();
    if (recorder) recorder->finish();
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGUSR1);
    ::sigprocmask(SIG_UNBLOCK, &mask, nullptr);
}

MirrorReady Proxy::ready() const {
    MirrorReady r;
    if (clients_.w) r.listen = local_endpoint(clients_.w.fd());
    if (capture_) r.capture = capture_->description();
    if (debug_clients_.w) r.debug_listen = local_endpoint(debug_clients_.w.fd());
    if (stats_listener_.w) r.stats = local_endpoint(stats_listener_.w.fd());
    return r;
}

void Proxy::log(const char* fmt, ...) {
    if (opt.quiet) return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    write_stderr_now(std::string("iprobe mirror: ") + line + "\n");
}

void Proxy::rate_limited_log(std::uint64_t count, const char* fmt, ...) {
    if (opt.quiet) return;
    if (count > 10 && count % 1000 != 0) return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    write_stderr_now(std::string("iprobe mirror: ") + line +
                     (count == 10 ? " (further messages like this one: every 1000th)" : "") + "\n");
}

void Proxy::run() {
    epoll_event events[256];
    while (!stopping) {
        const int n = ::epoll_wait(epfd, events, 256, wait_timeout_ms());
        if (n < 0 && errno != EINTR) throw_errno("epoll_wait");
        for (int i = 0; i < n; ++i) {
            static_cast<Handler*>(events[i].data.ptr)->on_event(events[i].events);
        }
        if (Clock::now() - last_debug_pass_ >= kDebugBatch) debug_pass();
        reap();
        tick();
    }
    debug_pass();  // what was queued for the debug copy still goes out
    reorders.classify(Clock::now(), true);
}

// While debug legs exist the loop wakes at least once per batch for them.
int Proxy::wait_timeout_ms() const {
    if (opt.debug.empty() || connections_.empty()) return 200;
    const auto due = last_debug_pass_ + kDebugBatch - Clock::now();
    return static_cast<int>(std::clamp<long>(
        std::chrono::ceil<std::chrono::milliseconds>(due).count(), 0, kDebugBatch.count()));
}

void Proxy::debug_pass() {
    last_debug_pass_ = Clock::now();
    std::vector<DebugLeg*> queued;
    queued.swap(debug_queue_);
    for (DebugLeg* leg : queued) leg->flush_batch();
    epoll_event events[256];
    for (int round = 0; round < 64; ++round) {
        const int n = ::epoll_wait(debug_epfd, events, 256, 0);
        for (int i = 0; i < n; ++i) static_cast<Handler*>(events[i].data.ptr)->on_event(events[i].events);
        if (n < 256) break;
    }
}

void Proxy::reap() {
    if (!retired_.empty())
        std::erase_if(debug_queue_, [&](DebugLeg* leg) { return retired_.count(&leg->owner()) != 0; });
    for (MirroredStream* c : retired_) connections_.erase(c->id());
    // Nothing open: no later reply can explain a difference still waiting.
    if (!retired_.empty() && connections_.empty()) reorders.classify(Clock::now(), true);
    retired_.clear();
    for (StatsClient* s : retired_stats_) {
        for (auto it = stats_clients_.begin(); it != stats_clients_.end(); ++it) {
            if (it->get() == s) {
                stats_clients_.erase(it);
                break;
            }
        }
    }
    retired_stats_.clear();
    retired_slots_.clear();
    if (accept_paused_) {
        accept_paused_ = false;
        clients_.w.want(EPOLLIN);
    }
}

void Proxy::tick() {
    const auto now = Clock::now();
    if (now - last_tick_ < std::chrono::milliseconds(100)) return;  // timeouts are coarse; the scan is O(connections)
    last_tick_ = now;
    if (capture_) capture_->tick();
    reorders.classify(now, false);
    for (auto& [id, c] : connections_)
        if (c->lingering() && now >= c->linger_deadline()) c->linger_timeout();
    for (auto it = slots_.begin(); it != slots_.end();) {
        Slot& s = *it->second;
        ++it;
        if (s.production_done && !s.debug_seen && now >= s.deadline) {
            ++stats.aggregator_unclaimed;
            maybe_drop_slot(s.ordinal);
        }
    }
    reap();
}

void Proxy::accept_clients(Acceptor& a) {
    for (int i = 0; i < 64; ++i) {
        UniqueFd fd(::accept4(a.w.fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
        if (!fd) {
            if (errno == EMFILE || errno == ENFILE) {
                log("out of file descriptors: not accepting until a connection closes");
                accept_paused_ = true;
                a.w.want(0);
            }
            return;
        }
        const std::uint32_t id = next_id_++;
        ++stats.accepted;
        ++stats.active;
        auto c = std::make_unique<Connection>(*this, id, std::move(fd));
        Connection* raw = c.get();
        connections_.emplace(id, std::move(c));
        std::optional<std::uint64_t> slot_ordinal;
        if (opt.upstream) slot_ordinal = next_production_ordinal_++;
        raw->start(slot_ordinal);
        if (raw->finished()) retire(raw);
    }
}

void Acceptor::on_event(std::uint32_t) {
    switch (kind) {
    case Kind::clients: px->accept_clients(*this); break;
    case Kind::debug_clients: px->accept_debug_client(*this); break;
    case Kind::stats: px->accept_stats(*this); break;
    case Kind::hook: px->accept_hook(*this); break;
    }
}

// Each connection to --hook-socket speaks as the control channel does.
void Proxy::accept_hook(Acceptor& a) {
    std::erase_if(hook_channels_, [](const auto& c) { return !c->w; });
    for (;;) {
        UniqueFd fd(::accept4(a.w.fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
        if (!fd) return;
        auto channel = std::make_unique<ControlChannel>();
        channel->px = this;
        channel->w = Watched(epfd, std::move(fd), channel.get());
        channel->w.want(EPOLLIN);
        hook_channels_.push_back(std::move(channel));
    }
}

void SignalHandler::on_event(std::uint32_t) {
    signalfd_siginfo info{};
    while (::read(w.fd(), &info, sizeof info) == sizeof info) px->on_signal(static_cast<int>(info.ssi_signo));
}

MirrorCommandReply Proxy::execute(const MirrorCommand& command) {
    MirrorCommandReply reply;
    reply.at_s = ms_since(stats.started) / 1000.0;
    reply.open_connections = stats.active;
    if (command.kind != MirrorCommand::Kind::record) {
        if (!capture_ || !opt.hold) {
            reply.error = "checkpoint and release are for a capture started with --hold";
            return reply;
        }
        if (command.kind == MirrorCommand::Kind::checkpoint) capture_->checkpoint(reply);
        else capture_->release(reply);
        reply.ok = reply.error.empty();
        return reply;
    }
    try {
        // Connections already open keep the recording they started in, which
        // ends when the last of them closes.
        recorder = command.path.empty() ? nullptr : std::make_shared<Recorder>(command.path, kRecordQueue);
        reply.ok = true;
    } catch (const Error& e) {
        recorder.reset();
        reply.error = e.what();
    }
    log("%s", command.path.empty() ? "recording stopped"
                                   : ("recording new connections into " + command.path).c_str());
    return reply;
}

void ControlChannel::on_event(std::uint32_t) {
    char buf[4096];
    for (;;) {
        const ssize_t n = ::read(w.fd(), buf, sizeof buf);
        if (n > 0) {
            in.append(buf, static_cast<std::size_t>(n));
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) w.close();  // the supervisor is gone
        break;
    }
    for (std::size_t nl; (nl = in.find('\n')) != std::string::npos; in.erase(0, nl + 1)) {
        MirrorCommandReply reply;
        try {
            reply = px->execute(parse_mirror_command(std::string_view(in).substr(0, nl)));
        } catch (const Error& e) {
            reply.error = e.what();
        }
        if (!w) return;
        // A line of a few hundred bytes on a descriptor the supervisor reads.
        const std::string line = to_json(reply) + "\n";
        std::size_t sent = 0;
        send_some(w.fd(), reinterpret_cast<const std::uint8_t*>(line.data()), line.size(), sent);
    }
    if (in.size() > 65536) in.clear();
}

void Proxy::on_signal(int sig) {
    if (sig == SIGUSR1) {
        const std::string s = stats_json(true);
        write_stderr_now(s + "\n");
        return;
    }
    stopping = true;
}

}  // namespace mirror_impl

using mirror_impl::Proxy;

void run_mirror(const MirrorOptions& options, const std::function<void(const MirrorReady&)>& on_ready) {
    Proxy proxy(options);
    on_ready(proxy.ready());
    proxy.run();
    const std::string final_stats = proxy.stats_json(false);
    if (options.json) {
        std::printf("{\"event\":\"stopped\",\"stats\":%s}\n", final_stats.c_str());
        std::fflush(stdout);
    } else if (!options.quiet) {
        std::fprintf(stderr, "iprobe mirror: stopped; final stats: %s\n", final_stats.c_str());
    }
}

}  // namespace iprobe::proxy
