#include "criu.h"

#include <fcntl.h>
#include <linux/capability.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

// Generated from CRIU's own schemas (launcher/CMakeLists.txt).
#include "rpc.pb.h"
#include "stats.pb.h"

#include "iprobe/launcher/clone.h"
#include "iprobe/support/error.h"
#include "iprobe/support/fd.h"
#include "iprobe/support/file.h"
#include "iprobe/support/install_layout.h"
#include "iprobe/support/number.h"
#include "process.h"

namespace iprobe::launcher {
namespace {

constexpr int kMinMajor = 4, kMinMinor = 2;
// criu's descriptors in `criu swrk 3`: its end of the socket pair, then the
// one handed over (a page server connection: criu_page_server_info.fd).
constexpr int kSwrkSocketFd = 3, kSwrkHandedFd = 4;
// CRIU's log level 2: errors and warnings, as `criu -v2`.
constexpr int kLogLevel = 2;

// Magic words of CRIU's service images (criu/include/magic.h).
constexpr std::uint32_t kImgServiceMagic = 0x55105940, kStatsMagic = 0x57093306;

std::uint32_t le32(const std::vector<std::uint8_t>& buf, std::size_t at) {
    return static_cast<std::uint32_t>(buf[at]) | static_cast<std::uint32_t>(buf[at + 1]) << 8 |
           static_cast<std::uint32_t>(buf[at + 2]) << 16 | static_cast<std::uint32_t>(buf[at + 3]) << 24;
}

// The log file name CRIU is given and the directory it lands in (CRIU takes
// no subdirectories in criu_opts.log_file: the directory is its work dir).
struct LogPlace {
    std::string dir, name;
};
LogPlace log_place(const std::string& log_path) {
    const auto slash = log_path.rfind('/');
    if (slash == std::string::npos) return {".", log_path};
    return {slash == 0 ? "/" : log_path.substr(0, slash), log_path.substr(slash + 1)};
}

UniqueFd open_dir(const std::string& path) {
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!fd) throw_errno("open " + path + " for CRIU");
    return fd;
}

// The options every iprobe dump and restore share.
void set_common_opts(criu_opts& opts, int images_dir_fd, int work_dir_fd, const std::string& log_name,
                     bool shell_job) {
    opts.set_images_dir_fd(images_dir_fd);
    opts.set_work_dir_fd(work_dir_fd);
    opts.set_log_file(log_name);
    opts.set_log_level(kLogLevel);
    // Connections production has open are not dumped: the clone's come back closed.
    opts.set_tcp_close(true);
    opts.set_ext_unix_sk(true);
    opts.set_file_locks(true);
    // A service started from a shell or a supervisor that did not make it
    // a session leader shares its session with processes outside the tree.
    if (shell_job) opts.set_shell_job(true);
}

CriuReply reply_of(const criu_resp& resp) {
    CriuReply r;
    r.success = resp.success();
    r.cr_errno = resp.has_cr_errno() ? resp.cr_errno() : 0;
    r.cr_errmsg = resp.has_cr_errmsg() ? resp.cr_errmsg() : std::string();
    return r;
}

int wait_status(pid_t pid) {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return -1;
    return status;
}

// One conversation with a `criu swrk` of our own: the request, the
// notifications it sends meanwhile (each answered), and its answer.
class SwrkSession {
public:
    SwrkSession(const std::string& criu, int handed_fd, const std::function<bool()>& in_child = {}) {
        const SwrkChild child = start_swrk(criu, handed_fd, in_child);
        if (child.pid < 0) throw_errno("starting " + criu + " swrk");
        pid_ = child.pid;
        socket_.reset(child.socket);
    }
    ~SwrkSession() {
        if (pid_ < 0) return;
        socket_.reset();  // criu swrk ends when its client does
        wait_status(pid_);
    }
    SwrkSession(const SwrkSession&) = delete;
    SwrkSession& operator=(const SwrkSession&) = delete;

    // The answer to `req`; `on_notify(script)` for each notification, which
    // is answered with success once it returns.  A criu that ends without
    // answering gives a reply with died_status set.
    // `on_sent` runs once the request is on its way.
    std::pair<CriuReply, criu_resp> call(const criu_req& req,
                                         const std::function<void(const std::string&)>& on_notify = {},
                                         const std::function<void()>& on_sent = {}) {
        if (!send_packet(socket_.get(), req.SerializeAsString()))
            return {died(), criu_resp()};
        if (on_sent) on_sent();
        for (;;) {
            const auto packet = receive_packet(socket_.get());
            if (!packet) return {died(), criu_resp()};
            criu_resp resp;
            if (!resp.ParseFromString(*packet))
                throw Error("CRIU answered with a message that is not a criu_resp (" + std::to_string(packet->size()) +
                            " bytes)");
            if (resp.type() != NOTIFY) return {reply_of(resp), std::move(resp)};
            if (on_notify && resp.has_notify()) on_notify(resp.notify().script());
            criu_req ack;
            ack.set_type(NOTIFY);
            ack.set_notify_success(true);
            if (!send_packet(socket_.get(), ack.SerializeAsString())) return {died(), criu_resp()};
        }
    }

private:
    CriuReply died() {
        socket_.reset();
        CriuReply r;
        r.died_status = wait_status(pid_);
        pid_ = -1;
        return r;
    }

    pid_t pid_ = -1;
    UniqueFd socket_;
};

// Whether CRIU's raising of RLIMIT_NOFILE to fs.nr_open (rlimit_unlimit_nofile,
// at the start of every dump) fails here: past our hard limit without
// CAP_SYS_RESOURCE.
bool nofile_raise_fails() {
    rlimit limit{};
    if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return false;
    // A /proc file: its size says 0, so read as a stream.
    std::ifstream file("/proc/sys/fs/nr_open");
    std::string text;
    if (!std::getline(file, text)) return false;
    const auto nr_open = parse_unsigned(text);
    if (!nr_open || *nr_open <= limit.rlim_max) return false;
    __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct caps[2]{};
    if (::syscall(SYS_capget, &header, caps) != 0) return false;
    return !(caps[CAP_SYS_RESOURCE / 32].effective & (1u << (CAP_SYS_RESOURCE % 32)));
}

Criu locate_criu() {
    std::vector<std::string> tried;
    if (const char* env = getenv("IPROBE_CRIU"); env && *env) {
        const auto version = query_criu_version(env);
        if (!version)
            throw Error(std::string("IPROBE_CRIU=") + env + " does not run as criu (`" + env +
                            " swrk` answered no VERSION request); unset it to use the CRIU scripts/setup installs",
                        ExitCode::unavailable);
        if (!version->at_least(kMinMajor, kMinMinor))
            throw Error(std::string("IPROBE_CRIU=") + env + " is CRIU " + version->text() +
                            "; iprobe needs CRIU >= 4.2 on this kernel (run scripts/setup)",
                        ExitCode::unavailable);
        return {env, version->text()};
    }
    // scripts/setup installs CRIU into a private prefix; the build links it
    // into libexec/iprobe (launcher/CMakeLists.txt).
    const std::string private_criu = (InstallLayout::current().libexec() / "criu").string();
    auto consider = [&](const std::string& path) -> std::optional<Criu> {
        const auto version = query_criu_version(path);
        if (version && version->at_least(kMinMajor, kMinMinor)) return Criu{path, version->text()};
        tried.push_back(path + (version ? " (" + version->text() + ")" : " (does not run)"));
        return std::nullopt;
    };
    if (access(private_criu.c_str(), X_OK) == 0)
        if (auto found = consider(private_criu)) return *found;
    if (std::string system_criu = find_program("criu"); !system_criu.empty())
        if (auto found = consider(system_criu)) return *found;
    std::string msg = "CRIU >= 4.2 not found";
    if (!tried.empty()) {
        msg += "; found only";
        for (const auto& t : tried) msg += " " + t;
    }
    msg += ". Run scripts/setup (it installs CRIU from Debian sid into third_party/cache/criu), "
           "or point IPROBE_CRIU at a criu >= 4.2";
    throw Error(msg, ExitCode::unavailable);
}

}  // namespace

std::string CriuReply::describe() const {
    if (died_status) {
        const int s = *died_status;
        if (s >= 0 && WIFEXITED(s)) return "criu exited with status " + std::to_string(WEXITSTATUS(s)) + " without answering";
        if (s >= 0 && WIFSIGNALED(s))
            return std::string("criu was killed by signal ") + ::strsignal(WTERMSIG(s)) + " before answering";
        return "criu ended without answering";
    }
    std::string out = cr_errmsg.empty() ? "CRIU gave no message" : cr_errmsg;
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
    if (cr_errno != 0) out += " (errno " + std::to_string(cr_errno) + ": " + std::strerror(cr_errno) + ")";
    if (first_error_is_harmless_rlimit)
        out += "\n  (CRIU answers with its first error only, and on this host that is always its harmless failure "
               "to raise RLIMIT_NOFILE without CAP_SYS_RESOURCE: the cause follows it in the full log)";
    return out;
}

std::string CriuVersion::text() const {
    std::string t = std::to_string(major) + "." + std::to_string(minor);
    if (sublevel > 0) t += "." + std::to_string(sublevel);
    return t;
}

bool CriuVersion::at_least(int want_major, int want_minor) const {
    return major > want_major || (major == want_major && minor >= want_minor);
}

SwrkChild start_swrk(const std::string& criu, int handed_fd, const std::function<bool()>& in_child) {
    int pair[2];
    if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) return {};
    const std::string fd_arg = std::to_string(kSwrkSocketFd);
    const char* argv[] = {criu.c_str(), "swrk", fd_arg.c_str(), nullptr};
    const pid_t pid = ::fork();
    if (pid < 0) {
        const int err = errno;
        ::close(pair[0]);
        ::close(pair[1]);
        errno = err;
        return {};
    }
    if (pid == 0) {
        note_this_child();
        // Its own process group: a terminal's Ctrl-C never cuts CRIU off
        // with production frozen.  Signals as a fresh process has them.
        ::setpgid(0, 0);
        reset_signals();
        stdio_to_dev_null();
        if (in_child && !in_child()) _exit(126);
        // Moved above both targets first, so neither dup2 overwrites the other.
        const int sock = ::fcntl(pair[1], F_DUPFD, 10);
        const int handed = handed_fd >= 0 ? ::fcntl(handed_fd, F_DUPFD, 10) : -1;
        ::dup2(sock, kSwrkSocketFd);
        if (handed >= 0) ::dup2(handed, kSwrkHandedFd);
        // Nothing else of ours reaches CRIU (a dumped service must not see it).
        ::close_range(handed >= 0 ? kSwrkHandedFd + 1 : kSwrkSocketFd + 1, ~0U, 0);
        ::execv(argv[0], const_cast<char* const*>(argv));
        _exit(127);
    }
    ::close(pair[1]);
    return {pid, pair[0]};
}

bool send_packet(int socket, const std::string& packet) {
    for (;;) {
        const ssize_t n = ::send(socket, packet.data(), packet.size(), MSG_NOSIGNAL);
        if (n == static_cast<ssize_t>(packet.size())) return true;
        if (n < 0 && errno == EINTR) continue;
        return false;
    }
}

std::optional<std::string> receive_packet(int socket) {
    for (;;) {
        // The packet's size first (MSG_PEEK | MSG_TRUNC gives it whole).
        const ssize_t size = ::recv(socket, nullptr, 0, MSG_PEEK | MSG_TRUNC);
        if (size < 0 && errno == EINTR) continue;
        if (size <= 0) return std::nullopt;
        std::string packet(static_cast<std::size_t>(size), '\0');
        // A notification may carry a descriptor (orphan-pts-master): taken and closed.
        alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)];
        iovec iov{packet.data(), packet.size()};
        msghdr msg{};
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control;
        msg.msg_controllen = sizeof control;
        ssize_t n;
        while ((n = ::recvmsg(socket, &msg, MSG_CMSG_CLOEXEC)) < 0 && errno == EINTR) {
        }
        for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
            if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
            const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (std::size_t i = 0; i < count; ++i) {
                int fd;
                std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
                ::close(fd);
            }
        }
        if (n != size) return std::nullopt;
        return packet;
    }
}

std::optional<CriuVersion> query_criu_version(const std::string& criu) {
    try {
        SwrkSession session(criu, -1);
        criu_req req;
        req.set_type(VERSION);
        const auto [reply, resp] = session.call(req);
        if (!reply.success || !resp.has_version()) return std::nullopt;
        CriuVersion v;
        v.major = resp.version().major_number();
        v.minor = resp.version().minor_number();
        v.sublevel = resp.version().has_sublevel() ? resp.version().sublevel() : 0;
        v.gitid = resp.version().gitid();
        return v;
    } catch (const Error&) {
        return std::nullopt;
    }
}

Criu find_criu() {
    // Each step of a clone asks (take_checkpoint, restore_clone, and the
    // command before them), and each asking started a criu; what a process
    // finds cannot change while it runs.  A failure is not kept.
    static const Criu found = locate_criu();
    return found;
}

DumpOutcome criu_dump(const std::string& criu, const DumpRequest& request) {
    const LogPlace log = log_place(request.log_path);
    const UniqueFd images = open_dir(request.images_dir), work = open_dir(log.dir);
    criu_req req;
    req.set_type(DUMP);
    criu_opts& opts = *req.mutable_opts();
    set_common_opts(opts, images.get(), work.get(), log.name, request.shell_job);
    opts.set_pid(request.pid);
    opts.set_leave_running(true);
    // A connection still in a listener's accept queue (a client connecting
    // at the freeze) is left to production, which accepts it as it resumes,
    // instead of failing the dump.
    opts.set_tcp_skip_in_flight(true);
    if (request.page_server_fd >= 0) opts.mutable_ps()->set_fd(kSwrkHandedFd);
    if (request.post_dump) opts.set_notify_scripts(true);
    // Dumped from inside production's network namespace: CRIU then treats it
    // as its own (no netns image) and the clone can be restored into any.
    const int netns_fd = request.netns_fd;
    SwrkSession session(criu, request.page_server_fd,
                        [netns_fd] { return netns_fd < 0 || ::setns(netns_fd, CLONE_NEWNET) == 0; });
    DumpOutcome outcome;
    outcome.reply = session
        .call(req,
              [&](const std::string& script) {
                  if (script != "post-dump") return;
                  // Never a reason to fail the dump: CRIU would fail it.
                  try {
                      request.post_dump();
                  } catch (const std::exception&) {
                  }
              },
              [] { test_pause("dump"); })  // CRIU dumps production meanwhile
        .first;
    if (outcome.reply.success) outcome.stats = read_dump_stats(log.dir);
    else outcome.reply.first_error_is_harmless_rlimit = !outcome.reply.died_status && nofile_raise_fails();
    return outcome;
}

PageServer criu_page_server(const std::string& criu, const std::string& images_dir, const std::string& log_path,
                            const std::string& address) {
    const LogPlace log = log_place(log_path);
    const UniqueFd images = open_dir(images_dir), work = open_dir(log.dir);
    criu_req req;
    // Not PAGE_SERVER: in its daemon mode CRIU 4.2 answers pid 0 (the
    // daemon's parent returns 0 from cr_page_server); the child variant
    // answers the server's own PID, which outlives criu swrk all the same.
    req.set_type(PAGE_SERVER_CHLD);
    criu_opts& opts = *req.mutable_opts();
    opts.set_images_dir_fd(images.get());
    opts.set_work_dir_fd(work.get());
    opts.set_log_file(log.name);
    opts.set_log_level(kLogLevel);
    opts.mutable_ps()->set_address(address);
    opts.mutable_ps()->set_port(0);  // CRIU binds a free port and says which
    SwrkSession session(criu, -1);
    const auto [reply, resp] = session.call(req);
    PageServer ps{reply};
    if (reply.success && resp.has_ps()) {
        ps.pid = resp.ps().pid();
        ps.port = resp.ps().port();
    }
    return ps;
}

std::string restore_request(int images_dir_fd, int work_dir_fd, const std::string& log_name, bool shell_job) {
    criu_req req;
    req.set_type(RESTORE);
    set_common_opts(*req.mutable_opts(), images_dir_fd, work_dir_fd, log_name, shell_job);
    return req.SerializeAsString();
}

RestoreReply parse_restore_reply(const std::string& packet, int status) {
    RestoreReply r;
    if (packet.empty()) {
        r.reply.died_status = status;
        return r;
    }
    criu_resp resp;
    if (!resp.ParseFromString(packet) || resp.type() != RESTORE)
        throw Error("CRIU answered the restore with a message that is not a restore's criu_resp");
    r.reply = reply_of(resp);
    r.reply.first_error_is_harmless_rlimit = !r.reply.success && nofile_raise_fails();
    if (resp.has_restore()) r.restored_pid = resp.restore().pid();
    return r;
}

DumpStats read_dump_stats(const std::string& dir) {
    const std::string path = dir + "/stats-dump";
    std::vector<std::uint8_t> buf;
    try {
        buf = read_file(path);
    } catch (const Error&) {
        throw Error("CRIU wrote no statistics (" + path + ")");
    }
    // Two magic words, then one length-prefixed stats_entry.
    if (buf.size() < 12 || le32(buf, 0) != kImgServiceMagic || le32(buf, 4) != kStatsMagic)
        throw Error(path + " is not CRIU's statistics image");
    const std::uint32_t len = le32(buf, 8);
    stats_entry entry;
    if (len > buf.size() - 12 || !entry.ParseFromArray(buf.data() + 12, static_cast<int>(len)))
        throw Error(path + " is truncated or malformed");
    if (!entry.has_dump()) throw Error("CRIU's statistics image has no dump statistics");
    const dump_stats_entry& d = entry.dump();
    DumpStats stats;
    stats.freezing_us = d.freezing_time();
    stats.frozen_us = d.frozen_time();
    stats.memdump_us = d.memdump_time();
    stats.memwrite_us = d.memwrite_time();
    stats.pages_scanned = d.pages_scanned();
    stats.pages_written = d.pages_written();
    return stats;
}

}  // namespace iprobe::launcher
