// The clone's PID 1 (the keeper): it restores the images with CRIU inside the
// new namespaces, reaps, and dies with its lifeline.
#include "clone_steps.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "criu.h"
#include "iprobe/support/error.h"
#include "iprobe/support/fd.h"
#include "iprobe/support/number.h"
#include "iprobe/support/proc.h"
#include "netns.h"
#include "process.h"

namespace fs = std::filesystem;

namespace iprobe::launcher::clone_steps {

namespace {

// The argument area the kernel shows as /proc/self/cmdline (fields 48 and 49
// of /proc/self/stat).
bool own_argument_area(unsigned long& start, unsigned long& end) {
    const auto number = [](int field) -> std::optional<std::uint64_t> {
        const auto text = proc::stat_field(::getpid(), field);
        return text ? parse_unsigned(*text) : std::nullopt;
    };
    const auto first = number(48), last = number(49);
    if (!first || !last || *first >= *last) return false;
    start = *first;
    end = *last;
    return true;
}

// So that ps shows "iprobe-keeper NAME" rather than the launcher's command
// line it was forked with (which names production's PID and would confuse
// `pgrep -f`).  PR_SET_MM needs CAP_SYS_RESOURCE, which a container's root
// may lack; then the inherited arguments are overwritten in place (this
// process's private copy), cut to their length.
void name_keeper_cmdline(const std::string& name) {
    static char cmdline[128];
    int n = std::snprintf(cmdline, sizeof cmdline, "iprobe-keeper%c%s", '\0', name.c_str());
    if (n <= 0) return;
    const auto length = std::min<unsigned long>(static_cast<unsigned long>(n) + 1, sizeof cmdline);
    auto start = reinterpret_cast<unsigned long>(cmdline);
    auto end = start + length;
    if (::prctl(PR_SET_MM, PR_SET_MM_ARG_END, end, 0, 0) == 0) {
        if (::prctl(PR_SET_MM, PR_SET_MM_ARG_START, start, 0, 0) == 0) return;
    } else if (::prctl(PR_SET_MM, PR_SET_MM_ARG_START, start, 0, 0) == 0 &&
               ::prctl(PR_SET_MM, PR_SET_MM_ARG_END, end, 0, 0) == 0) {
        return;
    }
    unsigned long arg_start = 0, arg_end = 0;
    if (!own_argument_area(arg_start, arg_end)) return;
    auto* area = reinterpret_cast<char*>(arg_start);
    const unsigned long room = arg_end - arg_start;
    std::memset(area, 0, room);
    std::memcpy(area, cmdline, std::min(length, room - 1));
}

void write_int(int fd, int v) { (void)!::write(fd, &v, sizeof v); }

// The keeper's descriptors CRIU reads the images and writes its log
// through (criu_opts.images_dir_fd, work_dir_fd: /proc/1/fd/N to CRIU);
// the host's mount namespace, where the clone's pins are.
constexpr int kImagesFd = 5, kWorkDirFd = 6, kHostMountNsFd = 7;

// The clone's state directory is still this clone's: no other keeper was
// recorded there since (a later clone of the same name).  Asked from the
// host's mount namespace, where /proc/self is our host PID.
bool state_is_ours(const std::string& state_dir) {
    std::ifstream in(state_dir + "/state");
    std::string line, keeper;
    while (std::getline(in, line))
        if (line.rfind("keeper_pid=", 0) == 0) keeper = line.substr(11);
    std::error_code ec;
    return keeper.empty() || keeper == fs::read_symlink("/proc/self", ec).string();
}

// The launcher that asked for this clone is gone and did not remove it
// (killed outright): nobody else will, so PID 1 ends the clone and removes
// what pins it on the host before it exits itself.  From the host's mount
// namespace (the keeper's own is a private copy, where /run/netns holds
// nothing of the host's); the namespace's mount only if it is still ours.
[[noreturn]] void end_clone_and_remove_pins(const KeeperPlan& plan, int code) {
    ::kill(-1, SIGKILL);  // from PID 1: every other member of the namespace
    int status = 0;
    while (::wait(&status) > 0 || errno == EINTR) {
    }
    if (::setns(kHostMountNsFd, CLONE_NEWNS) != 0) _exit(code);
    const std::string pin = netns_path_of(plan.name);
    struct stat ours {}, pinned {};
    if (plan.created_netns && ::stat("/proc/self/ns/net", &ours) == 0 && ::stat(pin.c_str(), &pinned) == 0 &&
        ours.st_dev == pinned.st_dev && ours.st_ino == pinned.st_ino) {
        ::umount2(pin.c_str(), MNT_DETACH);
        ::unlink(pin.c_str());
    }
    std::error_code ec;
    if (!plan.state_dir.empty() && state_is_ours(plan.state_dir)) fs::remove_all(plan.state_dir, ec);
    if (!plan.scratch_checkpoint.empty()) fs::remove_all(plan.scratch_checkpoint, ec);
    _exit(code);
}

// Reaps the clone's orphans until none is left.  With a lifeline, also
// leaves when its caller is gone: PID 1 exiting ends the whole PID
// namespace, so the clone goes with it, and its pins with the keeper.
[[noreturn]] void reap_until_gone(const KeeperPlan& plan, int lifeline) {
    int status = 0;
    if (lifeline < 0) {
        for (;;)
            if (::wait(&status) < 0 && errno == ECHILD) _exit(0);
    }
    for (;;) {
        pollfd p{lifeline, POLLIN, 0};
        const int ready = ::poll(&p, 1, 200);
        pid_t r;
        while ((r = ::waitpid(-1, &status, WNOHANG)) > 0) {
        }
        if (r < 0 && errno == ECHILD) _exit(0);
        // EOF (or stray bytes): the caller is gone
        if (ready > 0) end_clone_and_remove_pins(plan, 0);
    }
}

// What the keeper tells start_keeper, in order, on its status pipe: the
// stage (0: CRIU answered or ended, < 0: a step before it failed) and an
// errno; after stage 0, criu's wait status, the length of CRIU's answer
// (0: none) and the answer, a criu_resp, as CRIU sent it.
constexpr int kCriuAnswered = 0;

// Waits for CRIU's answer to the restore.  When the launcher that asked for
// the clone is gone (killed, or interrupted before it could say so), nobody
// would record or remove the clone: the restore is abandoned instead, and
// PID 1 exiting takes whatever CRIU restored so far with it.
std::string wait_restore_answer(const KeeperPlan& plan, const SwrkChild& criu, int status_fd) {
    for (;;) {
        // A pipe's writer sees POLLERR once its reader is closed.
        pollfd p[2] = {{criu.socket, POLLIN, 0}, {status_fd, 0, 0}};
        if (::poll(p, 2, -1) < 0) {
            if (errno == EINTR) continue;
            _exit(1);
        }
        if (p[1].revents & POLLERR) {
            ::kill(criu.pid, SIGKILL);
            end_clone_and_remove_pins(plan, 1);
        }
        if (p[0].revents) return receive_packet(criu.socket).value_or(std::string());
    }
}

// Runs as PID 1 of the new PID namespace, in a private mount namespace:
// gives CRIU a /proc of that namespace and the snapshot copies in place of
// the originals, restores, then reaps until the clone is gone.
// The restore as the keeper makes it: built before the fork.
struct RestoreCall {
    std::string work_dir;  // where CRIU writes plan.restore_log
    std::string request;   // a criu_req (restore_request)
};

[[noreturn]] void keeper_main(const KeeperPlan& plan, const RestoreCall& call, int status_fd, int host_mount_ns_fd) {
    ::setsid();
    // `iprobe debug` blocks signals it reads through a signalfd; CRIU must
    // not inherit that.
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::prctl(PR_SET_NAME, "iprobe-keeper", 0, 0, 0);
    name_keeper_cmdline(plan.name);
    ::prctl(PR_SET_PDEATHSIG, 0, 0, 0, 0);
    // Its CRIU notes itself to nobody (the launcher's guardian is not ours).
    note_children_to(-1);
    // Out of the way of the descriptors rearranged below.
    const int lifeline_high = plan.lifeline_fd >= 0 ? ::fcntl(plan.lifeline_fd, F_DUPFD, 10) : -1;
    const int host_mount_ns = ::fcntl(host_mount_ns_fd, F_DUPFD, 10);
    stdio_to_dev_null();
    ::dup2(status_fd, 3);
    status_fd = 3;
    int lifeline = -1;
    if (lifeline_high >= 0) {
        ::dup2(lifeline_high, 4);
        lifeline = 4;
    }
    ::dup2(host_mount_ns, kHostMountNsFd);
    ::close_range(lifeline < 0 ? 4 : 5, kHostMountNsFd - 1, 0);
    ::close_range(kHostMountNsFd + 1, ~0U, 0);
    auto fail = [&](int stage) {
        write_int(status_fd, stage);
        write_int(status_fd, errno);
        _exit(1);
    };
    if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) fail(-1);
    if (::mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0) fail(-2);
    // A /dev/shm of its own: POSIX shared memory the clone creates (an iprobe
    // runtime region named after its PID, which is production's PID) never
    // meets production's.  Snapshotted /dev/shm files are bound in below.
    // The images may live in /dev/shm: keep them reachable first.
    ::mkdir(plan.images_mount.c_str(), 0700);
    if (::mount(plan.images.c_str(), plan.images_mount.c_str(), nullptr, MS_BIND, nullptr) != 0) fail(-7);
    if (::mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777") != 0) fail(-6);
    for (const auto& [copy, original] : plan.binds) {
        struct stat st;
        if (under(original, "/dev/shm") && ::stat(copy.c_str(), &st) == 0) {
            if (S_ISDIR(st.st_mode)) {
                ::mkdir(original.c_str(), 0700);
            } else {
                int fd = ::open(original.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
                if (fd >= 0) ::close(fd);
            }
        }
        if (::mount(copy.c_str(), original.c_str(), nullptr, MS_BIND | MS_REC, nullptr) != 0) fail(-3);
    }

    // Each opened onto its number before the next is opened: none overwrites another.
    const auto open_as = [](const std::string& dir, int target) {
        const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
        if (fd < 0 || fd == target) return fd == target;
        const bool moved = ::dup2(fd, target) == target;
        ::close(fd);
        return moved;
    };
    if (!open_as(plan.images_mount, kImagesFd) || !open_as(call.work_dir, kWorkDirFd)) fail(-9);
    const SwrkChild criu = start_swrk(plan.criu, -1);
    if (criu.pid < 0) fail(-4);
    const std::string answer = send_packet(criu.socket, call.request) ? wait_restore_answer(plan, criu, status_fd)
                                                                              : std::string();
    ::close(criu.socket);
    int status = 0;
    while (::waitpid(criu.pid, &status, 0) < 0 && errno == EINTR) {
    }
    bool restored = false;
    try {
        restored = parse_restore_reply(answer, status).reply.success;
    } catch (const std::exception&) {
    }
    // iprobe's own per-PID state (locks of attach and trace) must not meet
    // production's: the clone has production's PID.  Mounted after the
    // restore, which still needed the clone's state directory under it.
    if (restored && ::mount("tmpfs", kStateRootParent, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0700") != 0) fail(-8);
    write_int(status_fd, kCriuAnswered);
    write_int(status_fd, 0);
    write_int(status_fd, status);
    write_int(status_fd, static_cast<int>(answer.size()));
    (void)!::write(status_fd, answer.data(), answer.size());
    ::close(status_fd);
    if (!restored) _exit(1);
    reap_until_gone(plan, lifeline);
}

bool read_exactly(int fd, char* p, std::size_t size, int timeout_ms) {
    std::size_t got = 0;
    while (got < size) {
        pollfd pfd{fd, POLLIN, 0};
        int r = ::poll(&pfd, 1, timeout_ms);
        if (r < 0 && errno == EINTR && !interrupted()) continue;
        if (r <= 0) return false;
        ssize_t n = ::read(fd, p + got, size - got);
        if (n <= 0) return false;
        got += static_cast<size_t>(n);
    }
    return true;
}

bool read_int(int fd, int& v, int timeout_ms) { return read_exactly(fd, reinterpret_cast<char*>(&v), sizeof v, timeout_ms); }

// The state directory goes away with the failed clone: the log is kept.
Error restore_failed(const KeeperPlan& plan, const std::string& headline) {
    return Error(headline + ", production is untouched" + keep_criu_log(plan.restore_log, plan.name, "restore"));
}

}  // namespace

pid_t start_keeper(const KeeperPlan& plan, const std::string& netns_path) {
    UniqueFd netns(::open(netns_path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!netns) throw_errno("open " + netns_path);
    // Kept by the keeper: where to remove the clone's pins from should the
    // launcher die without removing them.
    UniqueFd host_mount_ns(::open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC));
    if (!host_mount_ns) throw_errno("open /proc/self/ns/mnt");
    const auto slash = plan.restore_log.rfind('/');
    const RestoreCall call{plan.restore_log.substr(0, slash),
                           restore_request(kImagesFd, kWorkDirFd, plan.restore_log.substr(slash + 1), plan.shell_job)};
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) < 0) throw_errno("pipe");
    UniqueFd rd(fds[0]), wr(fds[1]);
    pid_t mid = ::fork();
    if (mid < 0) throw_errno("fork");
    if (mid == 0) {
        // Until it ends, the launcher's guardian waits: the keeper it forks
        // exists by then, to be found in the clone's namespace.
        note_this_child();
        ::close(rd.get());
        if (::setns(netns.get(), CLONE_NEWNET) != 0 || ::unshare(CLONE_NEWPID | CLONE_NEWNS) != 0) {
            write_int(wr.get(), -1);
            write_int(wr.get(), -5);
            write_int(wr.get(), errno);
            _exit(1);
        }
        pid_t keeper = ::fork();
        if (keeper == 0) keeper_main(plan, call, wr.get(), host_mount_ns.get());
        write_int(wr.get(), keeper);
        _exit(keeper < 0 ? 1 : 0);
    }
    wr.reset();
    int status = 0;
    while (::waitpid(mid, &status, 0) < 0 && errno == EINTR) {
    }
    int keeper = -1, stage = 0, err = 0;
    if (!read_int(rd.get(), keeper, 5000) || keeper <= 0) {
        read_int(rd.get(), stage, 100);
        read_int(rd.get(), err, 100);
        throw Error(std::string("cannot create the clone's PID and mount namespaces: ") + std::strerror(err));
    }
    // A large image takes a while to restore; CRIU reports failures itself.
    if (!read_int(rd.get(), stage, 600000)) {
        kill_keeper(keeper, start_time(keeper));
        throw_if_interrupted("the clone's restore was abandoned");
        throw restore_failed(plan, "the clone's keeper process died before CRIU finished restoring");
    }
    read_int(rd.get(), err, 1000);
    if (stage < 0) {
        kill_keeper(keeper, start_time(keeper));
        const char* what = stage == -1   ? "making mounts private"
                           : stage == -2 ? "mounting /proc"
                           : stage == -3 ? "bind-mounting the file snapshots"
                           : stage == -6 ? "mounting a private /dev/shm"
                           : stage == -7 ? "binding the checkpoint images"
                           : stage == -8 ? "mounting a private /run/iprobe"
                           : stage == -9 ? "opening the images for CRIU"
                                         : "starting criu";
        throw Error(std::string("preparing the clone failed while ") + what + ": " + std::strerror(err));
    }
    int criu_status = 0, length = 0;
    std::string answer;
    if (read_int(rd.get(), criu_status, 1000) && read_int(rd.get(), length, 1000) && length > 0 && length < (1 << 20)) {
        answer.resize(static_cast<std::size_t>(length));
        if (!read_exactly(rd.get(), answer.data(), answer.size(), 1000)) answer.clear();
    }
    const RestoreReply restored = parse_restore_reply(answer, criu_status);
    if (!restored.reply.success) {
        kill_keeper(keeper, start_time(keeper));
        throw restore_failed(plan, "criu restore failed: " + restored.reply.describe());
    }
    return keeper;
}

// Waits (up to 5 s) until it is gone: a launcher never returns while the
// clone it failed to make is still dying.
void kill_keeper(pid_t keeper, const std::string& started) {
    if (!still_running(keeper, started)) return;
    // PID 1 of the clone's PID namespace: killing it kills the whole clone.
    ::kill(keeper, SIGKILL);
    for (int i = 0; i < 500 && still_running(keeper, started); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

}  // namespace iprobe::launcher::clone_steps
