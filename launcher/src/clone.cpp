#include "iprobe/launcher/clone.h"

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
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "clone_steps.h"
#include "criu.h"
#include "iprobe/support/error.h"
#include "iprobe/support/fd.h"
#include "iprobe/support/file.h"
#include "netns.h"
#include "process.h"

namespace fs = std::filesystem;

namespace iprobe::launcher {

void require_root(const char* what) {
    if (geteuid() != 0)
        throw Error(std::string(what) + " needs root (CRIU checkpoints other processes and the clone gets new "
                                        "namespaces); run it with sudo",
                    ExitCode::permission);
}

void validate_name(const std::string& name) {
    if (name.empty() || name.size() > 64 || name[0] == '.' ||
        !std::all_of(name.begin(), name.end(), [](char c) {
            return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
        }))
        throw Error("bad clone name '" + name + "': use up to 64 letters, digits, '-', '_', '.'", ExitCode::usage);
}

namespace clone_steps {

const char* const kStateRootParent = "/run/iprobe";
const char* const kStateRoot = "/run/iprobe/clones";
// Snapshotting a working directory by default is skipped above this size;
// --fs-snapshot still copies it.
constexpr std::uintmax_t kDefaultDirSnapshotLimit = 256ull << 20;

void progress(const CloneOptions& o, const std::string& line) {
    if (o.progress) o.progress(line);
}

std::string state_dir(const std::string& name) { return std::string(kStateRoot) + "/" + name; }

std::string readlink_str(const std::string& path) {
    char buf[PATH_MAX];
    ssize_t n = ::readlink(path.c_str(), buf, sizeof buf - 1);
    if (n < 0) return {};
    return std::string(buf, static_cast<size_t>(n));
}

std::vector<pid_t> children_of(pid_t pid) {
    std::vector<pid_t> out;
    std::error_code ec;
    for (const auto& task : fs::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
        std::ifstream in(task.path() / "children");
        pid_t child;
        while (in >> child) out.push_back(child);
    }
    return out;
}

std::vector<pid_t> process_tree(pid_t root) {
    std::vector<pid_t> tree{root};
    for (size_t i = 0; i < tree.size(); ++i)
        for (pid_t c : children_of(tree[i])) tree.push_back(c);
    return tree;
}

// Field 22 of /proc/PID/stat: identifies a process across PID reuse.
std::string start_time(pid_t pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto close_paren = stat.rfind(')');
    if (close_paren == std::string::npos) return {};
    std::istringstream fields(stat.substr(close_paren + 2));
    std::string field;
    for (int i = 3; i <= 22 && fields >> field; ++i) {
        if (i == 22) return field;
    }
    return {};
}

pid_t session_of(pid_t pid) {
    pid_t sid = ::getsid(pid);
    return sid < 0 ? pid : sid;
}

// The session ID as the process itself sees it (the last NSsid field): 0
// when its session leader lives in an ancestor PID namespace.  -1: unknown.
pid_t session_seen_by(pid_t pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/status");
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("NSsid:", 0) != 0) continue;
        auto last = line.find_last_of(" \t");
        return static_cast<pid_t>(std::atol(line.c_str() + (last == std::string::npos ? 6 : last + 1)));
    }
    return -1;
}

// CRIU refuses such a tree only after freezing it, so it is refused here,
// before production is touched.
void require_visible_session_leaders(const std::vector<pid_t>& tree) {
    for (pid_t pid : tree) {
        if (session_seen_by(pid) != 0) continue;
        throw Error("PID " + std::to_string(pid) +
                        " cannot be checkpointed: its session leader is outside its PID namespace (it was "
                        "started without setsid by a process in a parent namespace, such as a container "
                        "runtime or a CI runner), and CRIU cannot dump such a session. Production is "
                        "untouched. Start the service as the leader of its own session (`setsid SERVICE "
                        "...`, a daemonizing service, or a systemd unit) and clone it again",
                    ExitCode::unavailable);
    }
}

// A terminal open in the tree (a service started from an interactive shell
// keeps its stdio on the shell's pty) makes CRIU's restore fail after the
// freeze: the pty's index is taken on this host and its master is not in the
// tree.  Refused before anything is frozen, with the way out.
void require_no_terminal(const std::vector<pid_t>& tree) {
    for (pid_t pid : tree) {
        const std::string fd_dir = "/proc/" + std::to_string(pid) + "/fd";
        std::error_code ec;
        for (const auto& entry : fs::directory_iterator(fd_dir, ec)) {
            std::error_code link_ec;
            const std::string target = fs::read_symlink(entry.path(), link_ec).string();
            const bool terminal = target.starts_with("/dev/pts/") || target == "/dev/tty" ||
                                  target == "/dev/console" ||
                                  (target.starts_with("/dev/tty") && target.size() > 8 &&
                                   std::isdigit(static_cast<unsigned char>(target[8])));
            if (!terminal) continue;
            throw Error("PID " + std::to_string(pid) + " has a terminal open (" + target + " on fd " +
                            entry.path().filename().string() +
                            "): it was started from an interactive shell, and CRIU cannot restore a clone "
                            "holding another session's terminal. Production is untouched. Start the service "
                            "away from the terminal, in its own session: `setsid SERVICE ... </dev/null "
                            ">>service.log 2>&1 &` (systemd units and daemonizing services already are), then "
                            "clone it",
                        ExitCode::unavailable);
        }
    }
}

// Running, not a zombie waiting for a parent (the keeper's is init, which
// may reap late).
bool alive(pid_t pid) {
    if (pid <= 0) return false;
    std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto close_paren = stat.rfind(')');
    return close_paren != std::string::npos && close_paren + 2 < stat.size() && stat[close_paren + 2] != 'Z' &&
           stat[close_paren + 2] != 'X';
}

bool under(const std::string& path, const std::string& dir) {
    if (dir == "/") return true;
    return path == dir || (path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 && path[dir.size()] == '/');
}

// POSIX shared memory (/dev/shm) is a file the service writes like any
// other; the rest of /dev, /proc and /sys are not files to copy.
bool system_path(const std::string& path) {
    if (under(path, "/dev/shm")) return false;
    for (const char* p : {"/proc", "/sys", "/dev", "/run/netns"})
        if (under(path, p)) return true;
    return false;
}

bool copyable_file(const std::string& path) {
    if (path.empty() || path[0] != '/' || system_path(path) || path.find(" (deleted)") != std::string::npos)
        return false;
    struct stat st;
    return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// Files mapped shared and writable (e.g. an iprobe runtime region, or the
// service's own shared memory): writes through them would reach production.
void shared_writable_mappings(pid_t pid, std::vector<std::string>& files) {
    std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
    std::string line;
    while (std::getline(maps, line)) {
        std::istringstream f(line);
        std::string range, perms, offset, dev, inode, path;
        f >> range >> perms >> offset >> dev >> inode;
        std::getline(f, path);
        path.erase(0, path.find_first_not_of(' '));
        if (perms.size() == 4 && perms[1] == 'w' && perms[3] == 's' && copyable_file(path)) files.push_back(path);
    }
}

std::uintmax_t tree_size(const std::string& dir, std::uintmax_t stop_after) {
    std::uintmax_t total = 0;
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(dir, fs::directory_options::skip_permission_denied, ec);
         it != fs::recursive_directory_iterator(); it.increment(ec)) {
        if (ec) break;
        std::error_code e2;
        if (it->is_regular_file(e2)) total += it->file_size(e2);
        if (total > stop_after) break;
    }
    return total;
}

// Files the clone must not share with production: explicit paths, plus
// regular files any process of the tree has open for writing and their
// working directories (when of a sensible size).
std::vector<std::string> snapshot_paths(const CloneOptions& o, const std::vector<pid_t>& tree) {
    std::vector<std::string> dirs, files;
    for (const auto& p : o.fs_snapshot) {
        std::error_code ec;
        fs::path abs = fs::weakly_canonical(fs::absolute(p), ec);
        if (ec || !fs::exists(abs))
            throw Error("--fs-snapshot: no such file or directory: " + p, ExitCode::not_found);
        (fs::is_directory(abs) ? dirs : files).push_back(abs.string());
    }
    if (o.default_snapshots) {
        for (pid_t pid : tree) {
            std::string proc = "/proc/" + std::to_string(pid);
            std::string cwd = readlink_str(proc + "/cwd");
            if (!cwd.empty() && cwd != "/" && cwd[0] == '/' && !system_path(cwd) &&
                cwd.find(" (deleted)") == std::string::npos) {
                if (tree_size(cwd, kDefaultDirSnapshotLimit) <= kDefaultDirSnapshotLimit)
                    dirs.push_back(cwd);
                else
                    progress(o, "not copying working directory " + cwd + " (over 256 MiB); the clone shares it "
                                "unless you pass --fs-snapshot " + cwd);
            }
            std::error_code ec;
            for (const auto& fd : fs::directory_iterator(proc + "/fd", ec)) {
                std::string target = readlink_str(fd.path().string());
                if (!copyable_file(target)) continue;
                std::ifstream info(proc + "/fdinfo/" + fd.path().filename().string());
                std::string key;
                unsigned flags = 0;
                while (info >> key) {
                    if (key == "flags:") {
                        info >> std::oct >> flags;
                        break;
                    }
                }
                if ((flags & O_ACCMODE) != O_RDONLY) files.push_back(target);
            }
            shared_writable_mappings(pid, files);
        }
    }
    std::sort(dirs.begin(), dirs.end());
    dirs.erase(std::unique(dirs.begin(), dirs.end()), dirs.end());
    // A directory inside another snapshotted one is covered by it.
    std::vector<std::string> out;
    for (const auto& d : dirs) {
        if (std::none_of(out.begin(), out.end(), [&](const std::string& o2) { return under(d, o2); }))
            out.push_back(d);
    }
    std::sort(files.begin(), files.end());
    files.erase(std::unique(files.begin(), files.end()), files.end());
    for (const auto& f : files) {
        if (std::none_of(out.begin(), out.end(), [&](const std::string& d) { return under(f, d); }))
            out.push_back(f);
    }
    return out;
}

// ---- recorded state of a clone -------------------------------------------

using State = std::map<std::string, std::string>;

void save_state(const std::string& name, const State& st) {
    std::string text;
    for (const auto& [k, v] : st) text += k + "=" + v + "\n";
    write_file_atomic(state_dir(name) + "/state", text.data(), text.size());
}

State read_state(const std::string& name) {
    std::ifstream in(state_dir(name) + "/state");
    if (!in) throw Error("no clone named '" + name + "' (see `iprobe clone --list`)", ExitCode::not_found);
    State st;
    std::string line;
    while (std::getline(in, line)) {
        auto eq = line.find('=');
        if (eq != std::string::npos) st[line.substr(0, eq)] = line.substr(eq + 1);
    }
    return st;
}

pid_t to_pid(const std::string& s) { return s.empty() ? -1 : static_cast<pid_t>(std::stol(s)); }

void kill_keeper(pid_t keeper, const std::string& started) {
    if (!alive(keeper) || start_time(keeper) != started) return;
    // PID 1 of the clone's PID namespace: killing it kills the whole clone.
    ::kill(keeper, SIGKILL);
    for (int i = 0; i < 500 && alive(keeper) && start_time(keeper) == started; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

void remove_tree(const std::string& path) {
    std::error_code ec;
    fs::remove_all(path, ec);
}

// ---- the clone's PID 1 -----------------------------------------------------


// So that ps shows "iprobe-keeper NAME" rather than the launcher's command
// line it was forked with (which names production's PID and would confuse
// `pgrep -f`).  Best effort: needs CAP_SYS_RESOURCE, which root has.
void name_keeper_cmdline(const std::string& name) {
    static char cmdline[128];
    int n = std::snprintf(cmdline, sizeof cmdline, "iprobe-keeper%c%s", '\0', name.c_str());
    if (n <= 0) return;
    auto start = reinterpret_cast<unsigned long>(cmdline);
    auto end = start + std::min<unsigned long>(static_cast<unsigned long>(n) + 1, sizeof cmdline);
    if (::prctl(PR_SET_MM, PR_SET_MM_ARG_END, end, 0, 0) == 0)
        ::prctl(PR_SET_MM, PR_SET_MM_ARG_START, start, 0, 0);
    else if (::prctl(PR_SET_MM, PR_SET_MM_ARG_START, start, 0, 0) == 0)
        ::prctl(PR_SET_MM, PR_SET_MM_ARG_END, end, 0, 0);
}

void write_int(int fd, int v) { (void)!::write(fd, &v, sizeof v); }

// Reaps the clone's orphans until none is left.  With a lifeline, also
// leaves when its caller is gone: PID 1 exiting ends the whole PID
// namespace, so the clone goes with it.
[[noreturn]] void reap_until_gone(int lifeline) {
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
        if (ready > 0) _exit(0);  // EOF (or stray bytes): the caller is gone
    }
}

// Runs as PID 1 of the new PID namespace, in a private mount namespace:
// gives CRIU a /proc of that namespace and the snapshot copies in place of
// the originals, restores, then reaps until the clone is gone.
[[noreturn]] void keeper_main(const KeeperPlan& plan, int status_fd) {
    ::setsid();
    // `iprobe debug` blocks signals it reads through a signalfd; CRIU must
    // not inherit that.
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::prctl(PR_SET_NAME, "iprobe-keeper", 0, 0, 0);
    name_keeper_cmdline(plan.name);
    ::prctl(PR_SET_PDEATHSIG, 0, 0, 0, 0);
    // Out of the way of the descriptors rearranged below.
    const int lifeline_high = plan.lifeline_fd >= 0 ? ::fcntl(plan.lifeline_fd, F_DUPFD, 10) : -1;
    int devnull = ::open("/dev/null", O_RDWR);
    ::dup2(devnull, 0);
    ::dup2(devnull, 1);
    ::dup2(devnull, 2);
    ::dup2(status_fd, 3);
    status_fd = 3;
    int lifeline = -1;
    if (lifeline_high >= 0) {
        ::dup2(lifeline_high, 4);
        lifeline = 4;
    }
    ::close_range(lifeline < 0 ? 4 : 5, ~0U, 0);
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

    std::vector<std::string> args = {plan.criu, "restore", "-D", plan.images_mount, "-d", "--tcp-close",
                                     "--ext-unix-sk", "--file-locks", "-v2", "-o", plan.restore_log};
    if (plan.shell_job) args.push_back("--shell-job");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t criu = ::fork();
    if (criu < 0) fail(-4);
    if (criu == 0) {
        ::close_range(3, ~0U, 0);
        ::execv(argv[0], argv.data());
        _exit(127);
    }
    int status = 0;
    while (::waitpid(criu, &status, 0) < 0 && errno == EINTR) {
    }
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    // iprobe's own per-PID state (locks of attach and trace) must not meet
    // production's: the clone has production's PID.  Mounted after the
    // restore, which still needed the clone's state directory under it.
    if (code == 0 && ::mount("tmpfs", kStateRootParent, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0700") != 0) fail(-8);
    write_int(status_fd, code);
    write_int(status_fd, 0);
    ::close(status_fd);
    if (code != 0) _exit(1);
    reap_until_gone(lifeline);
}

bool read_int(int fd, int& v, int timeout_ms) {
    size_t got = 0;
    char* p = reinterpret_cast<char*>(&v);
    while (got < sizeof v) {
        pollfd pfd{fd, POLLIN, 0};
        int r = ::poll(&pfd, 1, timeout_ms);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        ssize_t n = ::read(fd, p + got, sizeof v - got);
        if (n <= 0) return false;
        got += static_cast<size_t>(n);
    }
    return true;
}

// Starts the keeper inside `netns`; returns its host PID once CRIU has
// restored the clone, or throws with CRIU's reasons.
pid_t start_keeper(const KeeperPlan& plan, const std::string& netns_path) {
    UniqueFd netns(::open(netns_path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!netns) throw_errno("open " + netns_path);
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) < 0) throw_errno("pipe");
    UniqueFd rd(fds[0]), wr(fds[1]);
    pid_t mid = ::fork();
    if (mid < 0) throw_errno("fork");
    if (mid == 0) {
        ::close(rd.get());
        if (::setns(netns.get(), CLONE_NEWNET) != 0 || ::unshare(CLONE_NEWPID | CLONE_NEWNS) != 0) {
            write_int(wr.get(), -1);
            write_int(wr.get(), -5);
            write_int(wr.get(), errno);
            _exit(1);
        }
        pid_t keeper = ::fork();
        if (keeper == 0) keeper_main(plan, wr.get());
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
        ::kill(keeper, SIGKILL);
        throw Error("the clone's keeper process died before CRIU finished restoring");
    }
    read_int(rd.get(), err, 1000);
    if (stage != 0) {
        ::kill(keeper, SIGKILL);
        if (stage < 0) {
            const char* what = stage == -1   ? "making mounts private"
                               : stage == -2 ? "mounting /proc"
                               : stage == -3 ? "bind-mounting the file snapshots"
                               : stage == -6 ? "mounting a private /dev/shm"
                               : stage == -7 ? "binding the checkpoint images"
                               : stage == -8 ? "mounting a private /run/iprobe"
                                             : "starting criu";
            throw Error(std::string("preparing the clone failed while ") + what + ": " + std::strerror(err));
        }
        // The state directory goes away with the failed clone: keep the log.
        std::string kept_log = "/tmp/iprobe-clone-" + plan.name + "-restore.log";
        std::error_code ec;
        fs::copy_file(plan.restore_log, kept_log, fs::copy_options::overwrite_existing, ec);
        throw Error("criu restore failed (exit " + std::to_string(stage) + "), production is untouched. CRIU says:" +
                    criu_log_errors(plan.restore_log) + (ec ? "" : "\n  full log: " + kept_log));
    }
    return keeper;
}

pid_t ns_pid(pid_t host_pid) {
    std::ifstream in("/proc/" + std::to_string(host_pid) + "/status");
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("NSpid:", 0) == 0) {
            std::istringstream f(line.substr(6));
            pid_t p = -1, last = -1;
            while (f >> p) last = p;
            return last;
        }
    }
    return -1;
}

pid_t find_clone_root(pid_t keeper, pid_t pid_in_ns) {
    for (int i = 0; i < 200; ++i) {
        for (pid_t c : children_of(keeper))
            if (ns_pid(c) == pid_in_ns) return c;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return -1;
}

std::string fmt_ms(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3f", v);
    return buf;
}



// Non-loopback addresses of production's network namespace (ip -o addr
// lines: "2: eth0    inet 192.0.2.10/24 ..."), without their prefix.
std::vector<std::string> production_addresses(pid_t pid) {
    std::string ns = "--net=/proc/" + std::to_string(pid) + "/ns/net";
    RunResult r = run({"nsenter", ns, "ip", "-o", "addr", "show"});
    std::vector<std::string> out;
    std::istringstream lines(r.out);
    std::string line;
    while (std::getline(lines, line)) {
        std::istringstream f(line);
        std::string index, ifname, family, cidr;
        f >> index >> ifname >> family >> cidr;
        if ((family != "inet" && family != "inet6") || ifname == "lo") continue;
        std::string addr = cidr.substr(0, cidr.find('/'));
        if (addr.rfind("fe80:", 0) == 0) continue;  // link-local: per interface, never bound to by services
        out.push_back(addr);
    }
    return out;
}

// The clone's namespace has only loopback: give it production's addresses
// there (host routes), so listening sockets bound to them restore.
void add_addresses_to_loopback(const std::string& netns, const std::vector<std::string>& addrs) {
    for (const auto& a : addrs) {
        bool v6 = a.find(':') != std::string::npos;
        std::vector<std::string> cmd = {"ip", "-n", netns, "addr", "add", a + (v6 ? "/128" : "/32"), "dev", "lo"};
        if (v6) cmd.push_back("nodad");
        run(cmd);
    }
}

// Undoes what clone_process did so far when a later step fails.
struct Rollback {
    std::string state;
    std::string images;  // removed unless kept
    std::string netns;   // deleted when we created it
    bool armed = true;
    ~Rollback() {
        if (!armed) return;
        if (!netns.empty()) delete_netns(netns);
        if (!images.empty()) remove_tree(images);
        if (!state.empty()) remove_tree(state);
    }
};

bool same_ns(pid_t pid, const char* type) {
    struct stat a, b;
    std::string mine = std::string("/proc/self/ns/") + type;
    return ::stat(("/proc/" + std::to_string(pid) + "/ns/" + type).c_str(), &a) == 0 &&
           ::stat(mine.c_str(), &b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev;
}

// What the user can do about the usual causes of a failed dump.
std::string dump_failure_hint(pid_t pid, const std::string& reasons) {
    if (!same_ns(pid, "mnt"))
        return "\n  hint: the service runs in a mount namespace of its own (e.g. started with `ip netns exec`), "
               "which CRIU must checkpoint too; start it with `nsenter --net=/run/netns/NAME ...` instead";
    if (reasons.find("kerndat") != std::string::npos && reasons.find("unreachable") != std::string::npos)
        return "\n  hint: loopback is down in the service's network namespace; CRIU needs it up "
               "(ip link set lo up)";
    return {};
}

// Checkpoints production with `criu dump --leave-running`; returns the wall
// time.  On failure CRIU has resumed production; the error says so and
// keeps CRIU's log.
double dump_production(const CloneOptions& o, const Criu& criu, const std::string& name, size_t processes,
                       const std::string& images, const std::string& dump_log, bool& shell_job,
                       const std::vector<std::string>& extra_args) {
    // Dump from inside production's network namespace: CRIU then treats it
    // as its own (no netns image) and the clone can be restored into any.
    std::vector<std::string> dump_args = {criu.path, "dump", "-t", std::to_string(o.pid), "-D", images,
                                          "--leave-running", "--tcp-close", "--ext-unix-sk",
                                          "--file-locks", "-v2", "-o", dump_log};
    // A service started from a shell or a supervisor that did not make it a
    // session leader shares its session with processes outside the tree;
    // CRIU checkpoints such a tree only as a "shell job" (the clone then
    // joins the keeper's session).
    shell_job = session_of(o.pid) != o.pid;
    if (shell_job) dump_args.push_back("--shell-job");
    dump_args.insert(dump_args.end(), extra_args.begin(), extra_args.end());
    UniqueFd prod_netns;
    if (!same_ns(o.pid, "net")) {
        prod_netns.reset(::open(("/proc/" + std::to_string(o.pid) + "/ns/net").c_str(), O_RDONLY | O_CLOEXEC));
        if (!prod_netns) throw_errno("open production's network namespace");
    }
    int netns_fd = prod_netns.get();
    progress(o, "checkpointing PID " + std::to_string(o.pid) + " (" + std::to_string(processes) +
                    " process(es)) with CRIU " + criu.version + ", production keeps running");
    double dump_start = now_ms();
    RunResult dump = run(dump_args, [netns_fd] { return netns_fd < 0 || ::setns(netns_fd, CLONE_NEWNET) == 0; });
    double dump_ms = now_ms() - dump_start;
    if (!dump.ok()) {
        bool still_running = alive(o.pid);
        std::string reasons = criu_log_errors(dump_log);
        if (reasons.empty()) reasons = "\n  " + dump.err;
        reasons += dump_failure_hint(o.pid, reasons);
        // Keep the log for the user: move it out of the state dir we remove.
        std::string kept_log = "/tmp/iprobe-clone-" + name + "-dump.log";
        std::error_code ec;
        fs::copy_file(dump_log, kept_log, fs::copy_options::overwrite_existing, ec);
        throw Error("criu dump of PID " + std::to_string(o.pid) + " failed; " +
                        (still_running ? "production was resumed and keeps running"
                                       : "production is NOT running any more") +
                        ". CRIU says:" + reasons + (ec ? "" : "\n  full log: " + kept_log),
                    ExitCode::failure);
    }
    return dump_ms;
}

void record_state(const CloneResult& r, bool created_netns, const std::string& keeper_started, pid_t source) {
    State st;
    st["name"] = r.name;
    st["netns"] = r.netns_path;
    st["created_netns"] = created_netns ? "1" : "0";
    st["keeper_pid"] = std::to_string(r.keeper_pid);
    st["keeper_start"] = keeper_started;
    st["clone_pid"] = std::to_string(r.clone_pid);
    st["clone_pid_in_ns"] = std::to_string(source);
    st["source_pid"] = std::to_string(source);
    st["freeze_ms"] = fmt_ms(r.freeze_ms);
    st["freezing_ms"] = fmt_ms(r.freezing_ms);
    st["dump_ms"] = fmt_ms(r.dump_ms);
    st["restore_ms"] = fmt_ms(r.restore_ms);
    st["total_ms"] = fmt_ms(r.total_ms);
    st["pages_written"] = std::to_string(r.pages_written);
    std::string snaps;
    for (const auto& s : r.snapshots) snaps += (snaps.empty() ? "" : ":") + s;
    st["snapshots"] = snaps;
    st["images"] = r.images_dir;
    save_state(r.name, st);
}

}  // namespace clone_steps

using namespace clone_steps;

CloneResult clone_process(const CloneOptions& o) {
    double t0 = now_ms();
    require_root("iprobe clone");
    if (o.pid <= 0 || !fs::exists("/proc/" + std::to_string(o.pid)))
        throw Error("no process with PID " + std::to_string(o.pid), ExitCode::not_found);
    Criu criu = find_criu();
    std::string name = o.name.empty() ? "iprobe-clone-" + std::to_string(o.pid) : o.name;
    validate_name(name);
    if (fs::exists(state_dir(name) + "/state")) {
        if (load_clone(name).keeper_pid > 0)
            throw Error("a clone named '" + name + "' exists; remove it with `iprobe clone --destroy " + name + "`",
                        ExitCode::busy);
        progress(o, "removing the remains of clone " + name + " (its processes are gone)");
        destroy_clone(name);
    }

    std::vector<pid_t> tree = process_tree(o.pid);
    require_visible_session_leaders(tree);
    require_no_terminal(tree);
    std::vector<std::string> snapshots = snapshot_paths(o, tree);

    Rollback rollback;
    std::string state = state_dir(name);
    fs::create_directories(state);
    rollback.state = state;
    std::string images = o.keep_images.empty() ? std::string() : fs::absolute(o.keep_images).string();
    if (images.empty()) {
        images = (fs::is_directory("/dev/shm") ? std::string("/dev/shm") : state) + "/iprobe-images-" + name;
        remove_tree(images);
        rollback.images = images;
    } else {
        std::error_code ec;
        if (fs::exists(images) && !fs::is_empty(images, ec))
            throw Error("--keep-images " + images + " is not empty", ExitCode::bad_input);
    }
    fs::create_directories(images);

    bool shell_job = false;
    double dump_ms = dump_production(o, criu, name, tree.size(), images, state + "/dump.log", shell_job, {});
    DumpStats stats = read_dump_stats(images);
    progress(o, "production frozen for " + fmt_ms(static_cast<double>(stats.frozen_us) / 1e3) + " ms");

    // Copies are taken right after the dump, production running on: the
    // clone's files can be slightly ahead of its memory, never behind it.
    KeeperPlan plan{criu.path, images, state + "/restore.log", {}, shell_job, name, state + "/images", o.lifeline_fd};
    fs::create_directories(state + "/fs");
    for (size_t i = 0; i < snapshots.size(); ++i) {
        std::string copy = state + "/fs/" + std::to_string(i);
        run_checked({"cp", "-a", "--reflink=auto", snapshots[i], copy}, "copying " + snapshots[i] + " for the clone");
        plan.binds.emplace_back(copy, snapshots[i]);
    }

    std::string netns_path = netns_path_of(name);
    bool created_netns = ensure_netns(name);
    if (created_netns) {
        rollback.netns = name;
        // Sockets bound to production's own addresses must find them.
        add_addresses_to_loopback(name, production_addresses(o.pid));
    }

    double restore_start = now_ms();
    progress(o, "restoring the clone into network namespace " + name + " and a new PID namespace");
    pid_t keeper = start_keeper(plan, netns_path);
    double restore_ms = now_ms() - restore_start;
    std::string keeper_started = start_time(keeper);
    pid_t clone_pid = find_clone_root(keeper, o.pid);
    if (clone_pid < 0) {
        kill_keeper(keeper, keeper_started);
        throw Error("CRIU reported success but the clone's root process is not running; see " + plan.restore_log);
    }

    CloneResult r;
    r.name = name;
    r.netns_path = netns_path;
    r.clone_pid = clone_pid;
    r.clone_pid_in_ns = o.pid;
    r.keeper_pid = keeper;
    r.freeze_ms = static_cast<double>(stats.frozen_us) / 1e3;
    r.freezing_ms = static_cast<double>(stats.freezing_us) / 1e3;
    r.dump_ms = dump_ms;
    r.restore_ms = restore_ms;
    r.pages_written = stats.pages_written;
    r.snapshots = snapshots;
    if (!o.keep_images.empty()) r.images_dir = images;
    r.total_ms = now_ms() - t0;

    record_state(r, created_netns, keeper_started, o.pid);
    rollback.armed = false;
    if (o.keep_images.empty()) remove_tree(images);
    return r;
}

CloneResult load_clone(const std::string& name) {
    validate_name(name);
    State st = read_state(name);
    CloneResult r;
    r.name = name;
    r.netns_path = st["netns"];
    r.keeper_pid = to_pid(st["keeper_pid"]);
    r.clone_pid = to_pid(st["clone_pid"]);
    r.clone_pid_in_ns = to_pid(st["clone_pid_in_ns"]);
    auto num = [&](const char* k) { return st[k].empty() ? 0.0 : std::stod(st[k]); };
    r.freeze_ms = num("freeze_ms");
    r.freezing_ms = num("freezing_ms");
    r.dump_ms = num("dump_ms");
    r.restore_ms = num("restore_ms");
    r.total_ms = num("total_ms");
    r.pages_written = st["pages_written"].empty() ? 0 : std::stoull(st["pages_written"]);
    std::istringstream snaps(st["snapshots"]);
    std::string s;
    while (std::getline(snaps, s, ':'))
        if (!s.empty()) r.snapshots.push_back(s);
    r.images_dir = st["images"];
    if (!alive(r.keeper_pid) || start_time(r.keeper_pid) != st["keeper_start"]) r.keeper_pid = -1;
    return r;
}

void destroy_clone(const std::string& name) {
    require_root("iprobe clone --destroy");
    validate_name(name);
    State st = read_state(name);
    kill_keeper(to_pid(st["keeper_pid"]), st["keeper_start"]);
    if (!st["veth"].empty()) delete_link(st["veth"]);
    if (st["created_netns"] == "1") delete_netns(name);
    remove_tree(state_dir(name));
}

std::vector<std::string> list_clones() {
    std::vector<std::string> names;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(kStateRoot, ec))
        if (fs::exists(e.path() / "state")) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
}

void record_clone_veth(const std::string& name, const std::string& veth) {
    State st = read_state(name);
    st["veth"] = veth;
    save_state(name, st);
}

}  // namespace iprobe::launcher
