#include "iprobe/launcher/clone.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
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
#include <optional>
#include <sstream>
#include <string_view>
#include <thread>

#include <nlohmann/json.hpp>

#include "client_pinger.h"
#include "clone_guardian.h"
#include "clone_steps.h"
#include "criu.h"
#include "name_claim.h"
#include "iprobe/formats/checkpoint_hook.h"
#include "iprobe/support/error.h"
#include "iprobe/support/json.h"
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

std::string keep_criu_log(const std::string& log_path, const std::string& name, const char* step) {
    const std::string kept = "/tmp/iprobe-clone-" + name + "-" + step + ".log";
    std::error_code ec;
    fs::copy_file(log_path, kept, fs::copy_options::overwrite_existing, ec);
    return ec ? std::string() : "\n  full log: " + kept;
}

namespace clone_steps {

void progress(const CloneOptions& o, const std::string& line) {
    if (o.progress) o.progress(line);
}

std::string fmt_ms(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3f", v);
    return buf;
}

std::string checked_clone_name(const CloneOptions& o, const char* command) {
    require_root(command);
    if (o.pid <= 0 || !fs::exists("/proc/" + std::to_string(o.pid)))
        throw Error("no process with PID " + std::to_string(o.pid), ExitCode::not_found);
    std::string name = o.name.empty() ? "iprobe-clone-" + std::to_string(o.pid) : o.name;
    validate_name(name);
    return name;
}

// Non-loopback addresses of production's network namespace.
std::vector<std::string> production_addresses(pid_t pid) {
    std::vector<std::string> out;
    for (const InterfaceAddress& a : interface_addresses("/proc/" + std::to_string(pid) + "/ns/net")) {
        if ((a.family != "inet" && a.family != "inet6") || a.ifname == "lo" || a.local.empty()) continue;
        if (a.local.rfind("fe80:", 0) == 0) continue;  // link-local: per interface, never bound to by services
        out.push_back(a.local);
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

// What the user can do about the usual causes of a failed dump.
// Whether loopback is down in `pid`'s network namespace: CRIU, which probes
// the kernel's features there before it dumps anything, then fails.
bool loopback_down(pid_t pid) {
    const UniqueFd netns(::open(("/proc/" + std::to_string(pid) + "/ns/net").c_str(), O_RDONLY | O_CLOEXEC));
    if (!netns) return false;
    bool down = false;
    // A namespace is a property of the thread: asked from one of our own.
    std::thread([&] {
        if (::setns(netns.get(), CLONE_NEWNET) != 0) return;
        const UniqueFd s(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
        ifreq ifr{};
        std::strncpy(ifr.ifr_name, "lo", sizeof ifr.ifr_name - 1);
        if (s && ::ioctl(s.get(), SIOCGIFFLAGS, &ifr) == 0) down = !(ifr.ifr_flags & IFF_UP);
    }).join();
    return down;
}

// A process of the tree with a perf_event file open (which CRIU cannot
// checkpoint): "PID N fd K", or "".
std::string perf_event_holder(pid_t root) {
    for (pid_t pid : process_tree(root)) {
        std::error_code ec;
        for (const auto& entry : fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
            std::error_code link_ec;
            if (fs::read_symlink(entry.path(), link_ec).string() == "anon_inode:[perf_event]")
                return "PID " + std::to_string(pid) + " fd " + entry.path().filename().string();
        }
    }
    return {};
}

std::string dump_failure_hint(pid_t pid) {
    if (const std::string holder = perf_event_holder(pid); !holder.empty())
        return "\n  hint: " + holder + " is a perf_event file (a profiler's counter), which CRIU cannot "
               "checkpoint; clone the service while nothing profiles it through that file";
    if (!same_ns(pid, "mnt"))
        return "\n  hint: the service runs in a mount namespace of its own (e.g. started with `ip netns exec`), "
               "which CRIU must checkpoint too; start it with `nsenter --net=/run/netns/NAME ...` instead";
    if (loopback_down(pid))
        return "\n  hint: loopback is down in the service's network namespace; CRIU needs it up "
               "(ip link set lo up)";
    return {};
}

// Tells the mirror listening on `socket_path` that production is frozen and
// waits for its answer, at most IPROBE_CHECKPOINT_HOOK_TIMEOUT_MS
// (include/iprobe/formats/checkpoint_hook.h).  Never fails: a mirror that
// does not answer must not cost production its checkpoint (the session then
// reports the clone's start as unknown).
void tell_mirror_production_is_frozen(const std::string& socket_path) {
    sockaddr_un at{};
    at.sun_family = AF_UNIX;
    if (socket_path.size() >= sizeof at.sun_path) return;
    std::memcpy(at.sun_path, socket_path.c_str(), socket_path.size() + 1);
    const UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd || ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&at), sizeof at) != 0) return;
    const std::string_view command = IPROBE_CHECKPOINT_HOOK_COMMAND;
    if (::send(fd.get(), command.data(), command.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(command.size())) return;
    const double deadline = now_ms() + IPROBE_CHECKPOINT_HOOK_TIMEOUT_MS;
    char reply[4096];
    for (;;) {
        const double left = deadline - now_ms();
        pollfd p{fd.get(), POLLIN, 0};
        if (left <= 0 || ::poll(&p, 1, static_cast<int>(left) + 1) != 1) return;
        const ssize_t n = ::read(fd.get(), reply, sizeof reply);
        if (n <= 0 || std::memchr(reply, '\n', static_cast<std::size_t>(n))) return;
    }
}

// Checkpoints production with CRIU's DUMP request (leave_running); returns
// the wall time.  On failure CRIU has resumed production; the error says
// so with CRIU's own message, and keeps CRIU's log for the user.
Dumped dump_production(const CloneOptions& o, const Criu& criu, const std::string& name, size_t processes,
                       const std::string& images, const std::string& dump_log, bool& shell_job, int page_server_fd) {
    DumpRequest request;
    request.pid = o.pid;
    request.images_dir = images;
    request.log_path = dump_log;
    request.page_server_fd = page_server_fd;
    // CRIU checkpoints a tree that shares its session with processes
    // outside it only as a "shell job" (the clone then joins the keeper's
    // session).
    shell_job = session_of(o.pid) != o.pid;
    request.shell_job = shell_job;
    if (!o.frozen_hook_socket.empty() || test_pause_armed("frozen"))
        request.post_dump = [&socket = o.frozen_hook_socket] {
            test_pause("frozen");  // CRIU holds production frozen meanwhile
            if (!socket.empty()) tell_mirror_production_is_frozen(socket);
        };
    UniqueFd prod_netns;
    if (!same_ns(o.pid, "net")) {
        prod_netns.reset(::open(("/proc/" + std::to_string(o.pid) + "/ns/net").c_str(), O_RDONLY | O_CLOEXEC));
        if (!prod_netns) throw_errno("open production's network namespace");
    }
    request.netns_fd = prod_netns.get();
    progress(o, "checkpointing PID " + std::to_string(o.pid) + " (" + std::to_string(processes) +
                    " process(es)) with CRIU " + criu.version + ", production keeps running");
    const double dump_start = now_ms();
    const DumpOutcome outcome = criu_dump(criu.path, request);
    const double dump_ms = now_ms() - dump_start;
    const CriuReply& dump = outcome.reply;
    if (!dump.success) {
        const bool still_running = alive(o.pid);
        throw Error("criu dump of PID " + std::to_string(o.pid) + " failed; " +
                        (still_running ? "production was resumed and keeps running"
                                       : "production is NOT running any more") +
                        ". CRIU says: " + dump.describe() + dump_failure_hint(o.pid) +
                        keep_criu_log(dump_log, name, "dump"),
                    ExitCode::failure);
    }
    return {dump_ms, outcome.stats};
}

}  // namespace clone_steps

using namespace clone_steps;

namespace {

// `scratch_too`: also a scratch checkpoint left by a launcher killed before
// it could remove it.  Not when making a clone: that launcher's own new
// checkpoint may be there.  Returns what it removed.
std::vector<Removed> remove_clone(const std::string& name, bool scratch_too) {
    // A launcher killed before it recorded the clone left at most a state
    // directory without a state file and its scratch checkpoint.
    const bool remains_only = !fs::exists(state_dir(name) + "/state");
    if (remains_only && !fs::exists(state_dir(name)) && !(scratch_too && fs::exists(scratch_checkpoint_dir(name))))
        read_state(name);  // throws: no such clone
    State st = remains_only ? State{} : read_state(name);
    std::vector<Removed> removed;
    auto keeper_gone = [&](pid_t keeper, const std::string& started) {
        if (!still_running(keeper, started)) return;
        kill_keeper(keeper, started);
        removed.push_back({"clone", "keeper PID " + std::to_string(keeper) + " and the clone's processes"});
    };
    keeper_gone(to_pid(st["keeper_pid"]), st["keeper_start"]);
    // Killed mid-restore, the launcher had not learned its keeper's PID.
    if (st["keeper_pid"].empty() && !st["netns"].empty())
        for (pid_t keeper : keepers_in(st["netns"])) keeper_gone(keeper, start_time(keeper));
    if (!st["veth"].empty() && link_exists(st["veth"])) {
        delete_link(st["veth"]);
        removed.push_back({"veth", st["veth"]});
    }
    // Recorded before `ip netns add` ran: a launcher killed while it ran
    // leaves a namespace it never got to note as made.
    if (st["created_netns"] == "1" && fs::exists(netns_path_of(name))) {
        delete_netns(name);
        removed.push_back({"netns", name});
    }
    if (scratch_too && fs::exists(scratch_checkpoint_dir(name))) {
        remove_tree(scratch_checkpoint_dir(name));
        removed.push_back({"checkpoint", scratch_checkpoint_dir(name)});
    }
    if (fs::exists(state_dir(name))) {
        remove_tree(state_dir(name));
        removed.push_back({"state", state_dir(name)});
    }
    return removed;
}

// Under the name's claim: refuses a name in use; removes what a clone of
// that name left behind when its processes are gone (its caller's lifeline
// closed).
void clear_remains_of(const std::string& name, const std::function<void(const std::string&)>& progress) {
    if (!fs::exists(state_dir(name) + "/state")) return;
    if (being_restored(read_state(name)))
        throw Error("clone '" + name + "' is being made by another iprobe", ExitCode::busy);
    if (load_clone(name).keeper_pid > 0)
        throw Error("a clone named '" + name + "' exists; remove it with `iprobe clone --destroy " + name + "`",
                    ExitCode::busy);
    if (progress) progress("removing the remains of clone " + name + " (its processes are gone)");
    remove_clone(name, false);
}

// Claims `name` (name_claim.h) and records who makes it, this launcher under
// `guardian`, before anything of the clone exists; only the claim when this
// process did already (an empty one when it holds that too).
NameClaim begin_clone(const std::string& name, CloneGuardian& guardian,
                      const std::function<void(const std::string&)>& progress) {
    validate_name(name);
    NameClaim claim(name, "local", &guardian);
    if (fs::exists(state_dir(name) + "/state") && made_here(read_state(name))) return claim;
    clear_remains_of(name, progress);
    guardian.guard_clone(name);
    record_making(name, guardian.pid(), guardian.started());
    return claim;
}

double realtime_s() {
    timespec ts{};
    ::clock_gettime(CLOCK_REALTIME, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

void save_checkpoint(const Checkpoint& cp) {
    JsonWriter j;
    j.begin_object().field("format", "iprobe-checkpoint 1").field("pid", cp.pid).field("shell_job", cp.shell_job);
    j.field("snapshots", cp.snapshots).field("addresses", cp.addresses);
    j.field("freeze_ms", cp.freeze_ms).field("freezing_ms", cp.freezing_ms).field("dump_ms", cp.dump_ms);
    j.field("pages_written", static_cast<std::uint64_t>(cp.pages_written)).field("taken_at_s", cp.taken_at_s);
    const std::string text = j.end_object().str() + "\n";
    write_file_atomic(cp.dir + "/checkpoint.json", text.data(), text.size());
}

}  // namespace

void clone_steps::remove_guarded_clone(const std::string& name, pid_t guardian) {
    if (fs::exists(state_dir(name) + "/state") && to_pid(read_state(name)["guardian_pid"]) != guardian) return;
    remove_clone(name, false);
}

Checkpoint take_checkpoint(const CloneOptions& o, const std::string& dir) {
    require_user_process(o.pid);
    const std::string name = checked_clone_name(o, "iprobe clone");
    Criu criu = find_criu();
    std::vector<pid_t> tree = process_tree(o.pid);
    require_visible_session_leaders(tree);
    require_no_terminal(tree);
    std::vector<std::string> snapshots = snapshot_paths(o, tree);

    InterruptGuard interrupts;
    Checkpoint cp;
    cp.dir = fs::absolute(dir).string();
    std::error_code ec;
    if (fs::exists(cp.dir) && !fs::is_empty(cp.dir, ec))
        throw Error("checkpoint directory " + cp.dir + " is not empty", ExitCode::bad_input);
    Rollback rollback;
    rollback.images = cp.dir;
    fs::create_directories(cp.dir + "/images");
    cp.pid = o.pid;
    test_pause("checkpoint");
    const Dumped dumped =
        dump_production(o, criu, name, tree.size(), cp.dir + "/images", cp.dir + "/dump.log", cp.shell_job);
    cp.dump_ms = dumped.dump_ms;
    const DumpStats& stats = dumped.stats;
    cp.taken_at_s = realtime_s();
    cp.freeze_ms = static_cast<double>(stats.frozen_us) / 1e3;
    cp.freezing_ms = static_cast<double>(stats.freezing_us) / 1e3;
    cp.pages_written = stats.pages_written;
    progress(o, "production could not answer for " + fmt_ms(cp.freezing_ms + cp.freeze_ms) + " ms (stopping it " +
                    fmt_ms(cp.freezing_ms) + " ms, frozen " + fmt_ms(cp.freeze_ms) + " ms)");
    throw_if_interrupted("the checkpoint was removed");

    // Copies are taken right after the dump, production running on: the
    // clone's files can be slightly ahead of its memory, never behind it.
    fs::create_directories(cp.dir + "/fs");
    for (size_t i = 0; i < snapshots.size(); ++i) {
        run_checked({"cp", "-a", "--reflink=auto", snapshots[i], cp.dir + "/fs/" + std::to_string(i)},
                    "copying " + snapshots[i] + " for the clone");
        if (i == 0) test_pause("copy");
    }
    cp.snapshots = snapshots;
    cp.addresses = production_addresses(o.pid);
    save_checkpoint(cp);
    rollback.armed = false;
    return cp;
}

Checkpoint load_checkpoint(const std::string& dir) {
    Checkpoint cp;
    cp.dir = fs::absolute(dir).string();
    std::string text;
    try {
        const auto bytes = read_file(cp.dir + "/checkpoint.json");
        text.assign(bytes.begin(), bytes.end());
    } catch (const std::exception&) {
        throw Error(cp.dir + " holds no checkpoint (no checkpoint.json)", ExitCode::not_found);
    }
    try {
        const auto doc = nlohmann::json::parse(text);
        if (doc.value("format", "") != "iprobe-checkpoint 1") throw Error(cp.dir + "/checkpoint.json: unknown format", ExitCode::bad_input);
        cp.pid = doc.at("pid").get<pid_t>();
        cp.shell_job = doc.at("shell_job").get<bool>();
        cp.snapshots = doc.at("snapshots").get<std::vector<std::string>>();
        cp.addresses = doc.at("addresses").get<std::vector<std::string>>();
        cp.freeze_ms = doc.value("freeze_ms", 0.0);
        cp.freezing_ms = doc.value("freezing_ms", 0.0);
        cp.dump_ms = doc.value("dump_ms", 0.0);
        cp.pages_written = doc.value("pages_written", 0ull);
        cp.taken_at_s = doc.value("taken_at_s", 0.0);
    } catch (const nlohmann::json::exception& e) {
        throw Error(cp.dir + "/checkpoint.json: " + e.what(), ExitCode::bad_input);
    }
    if (!fs::is_directory(cp.dir + "/images"))
        throw Error(cp.dir + " has no images/ (CRIU's checkpoint)", ExitCode::bad_input);
    return cp;
}

CloneResult restore_clone(const Checkpoint& cp, const RestoreOptions& ro) {
    const double t0 = now_ms();
    require_root("iprobe clone");
    const Criu criu = find_criu();
    const std::string& name = ro.name;
    // Armed before anything of the clone is made, unless the caller's is.
    std::optional<CloneGuardian> own_guardian;
    CloneGuardian* guardian = CloneGuardian::current();
    if (!guardian) guardian = &own_guardian.emplace();
    // Released after the rollback below has run, should it run.
    const NameClaim claim = begin_clone(name, *guardian, ro.progress);
    InterruptGuard interrupts;
    CloneOptions progress_to;
    progress_to.progress = ro.progress;

    Rollback rollback;
    const std::string state = state_dir(name);
    fs::create_directories(state + "/fs");
    rollback.state = state;
    KeeperPlan plan{criu.path, cp.dir + "/images", state + "/restore.log", {}, cp.shell_job, name, state + "/images",
                    ro.lifeline_fd, state, false, ro.scratch_checkpoint ? cp.dir : std::string()};
    // Each clone writes into copies of its own; the checkpoint's stay as taken.
    for (size_t i = 0; i < cp.snapshots.size(); ++i) {
        const std::string copy = state + "/fs/" + std::to_string(i);
        run_checked({"cp", "-a", "--reflink=auto", cp.dir + "/fs/" + std::to_string(i), copy},
                    "copying " + cp.snapshots[i] + " for the clone");
        plan.binds.emplace_back(copy, cp.snapshots[i]);
    }

    throw_if_interrupted("the clone's file copies were removed");
    const std::string netns_path = netns_path_of(name);
    // Recorded before the namespace is made: killed while `ip netns add`
    // runs, this launcher leaves --destroy what it needs to remove it.
    const bool created_netns = !fs::exists(netns_path);
    record_restoring(name, netns_path, created_netns);
    plan.created_netns = created_netns;
    if (created_netns) {
        rollback.netns = name;
        ensure_netns(name);
        test_pause("netns");
        // Sockets bound to production's own addresses must find them.
        add_addresses_to_loopback(name, cp.addresses);
    }
    test_pause("keeper");

    const double restore_start = now_ms();
    progress(progress_to, "restoring the clone into network namespace " + name + " and a new PID namespace");
    const pid_t keeper = start_keeper(plan, netns_path);
    const double restore_ms = now_ms() - restore_start;
    const std::string keeper_started = start_time(keeper);
    const pid_t clone_pid = find_clone_root(keeper, cp.pid);
    if (clone_pid < 0 || interrupted()) {
        kill_keeper(keeper, keeper_started);
        throw_if_interrupted("the clone and its namespace were removed");
        throw Error("CRIU reported success but the clone's root process is not running; see " + plan.restore_log);
    }

    CloneResult r;
    r.name = name;
    r.netns_path = netns_path;
    r.clone_pid = clone_pid;
    r.clone_pid_in_ns = cp.pid;
    r.keeper_pid = keeper;
    r.freeze_ms = cp.freeze_ms;
    r.freezing_ms = cp.freezing_ms;
    r.dump_ms = cp.dump_ms;
    r.restore_ms = restore_ms;
    r.pages_written = cp.pages_written;
    r.snapshots = cp.snapshots;
    // As if the checkpoint had been taken for this clone alone (several
    // clones, or a recorded generation, share one): never less than
    // checkpoint + restore.
    r.total_ms = cp.dump_ms + (now_ms() - t0);
    record_state(r, created_netns, keeper_started, cp.pid);
    rollback.armed = false;
    if (own_guardian) own_guardian->release();
    return r;
}

CloneResult clone_process(const CloneOptions& o) {
    const double t0 = now_ms();
    const std::string name = checked_clone_name(o, "iprobe clone");
    find_criu();
    // Forked before anything that outlives a launcher killed outright is
    // made: until the clone is recorded, it removes what this launcher made.
    CloneGuardian guardian;
    const NameClaim claim = begin_clone(name, guardian, o.progress);
    Rollback rollback;
    rollback.state = state_dir(name);
    // Kept with --keep-images, else on tmpfs for as long as the restore takes.
    const bool keep = !o.keep_images.empty();
    const std::string dir = keep ? fs::absolute(o.keep_images).string() : scratch_checkpoint_dir(name);
    guardian.guard_scratch(dir);
    if (!keep) remove_tree(dir);
    CloneOptions named = o;
    named.name = name;
    // Also between the checkpoint and the restore: an interrupt there removes the checkpoint.
    InterruptGuard interrupts;
    // Production as one of its clients sees the checkpoint.
    auto client = o.client_view ? ClientPinger::watch(o.pid) : nullptr;
    const Checkpoint cp = take_checkpoint(named, dir);
    const double client_seen_ms = client ? client->window_max_us() / 1e3 : -1;
    client.reset();
    struct RemoveUnlessKept {
        std::string dir;
        ~RemoveUnlessKept() {
            if (!dir.empty()) remove_tree(dir);
        }
    } cleanup{keep ? std::string() : dir};
    CloneResult r = restore_clone(cp, {name, o.progress, o.lifeline_fd, !keep});
    r.client_seen_ms = client_seen_ms;
    r.total_ms = now_ms() - t0;
    // The list shows what this command printed: its whole time.
    State st = read_state(name);
    if (keep) {
        r.images_dir = dir;
        st["images"] = dir;
    }
    st["total_ms"] = fmt_ms(r.total_ms);
    save_state(name, st);
    test_pause("restored");
    rollback.armed = false;
    guardian.release();
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
    if (!still_running(r.keeper_pid, st["keeper_start"])) r.keeper_pid = -1;
    return r;
}

std::vector<Removed> destroy_clone(const std::string& name) {
    require_root("iprobe clone --destroy");
    validate_name(name);
    return remove_clone(name, true);
}

std::vector<std::string> list_clones() {
    std::vector<std::string> names;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(kStateRoot, ec))
        if (fs::exists(e.path() / "state")) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
}

std::string netns_path_of_clone(const std::string& name) { return netns_path_of(name); }

void record_clone_veth(const std::string& name, const std::string& veth) {
    State st = read_state(name);
    st["veth"] = veth;
    save_state(name, st);
}

}  // namespace iprobe::launcher
