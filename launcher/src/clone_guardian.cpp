#include "clone_guardian.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "clone_steps.h"
#include "name_claim.h"
#include "iprobe/support/error.h"
#include "process.h"

namespace iprobe::launcher::clone_steps {
namespace {

// The records on the guardian's socket (a seqpacket pair: each send is one
// record, whole, however many write): a kind, the payload's length, the
// payload.  A helper's is a ChildNote.
enum RecordKind : std::uint32_t {
    kChild = ChildNote::kKind,  // payload: the helper's PID
    kClone = 2,                 // a clone's name
    kScratch = 3,               // a scratch checkpoint's path
    kRelease = 4,               // no payload: exit, removing nothing
    kPodman = 5,                // a container clone's podman object: "KIND NAME"
    kClaim = 6,                 // a clone name's claim (name_claim.h)
};
struct RecordHeader {
    std::uint32_t kind = 0;
    std::uint32_t length = 0;
};
static_assert(sizeof(RecordHeader) + sizeof(std::int32_t) == sizeof(ChildNote));

// The guardian's end of the socket pair.
constexpr int kSocketFd = 3;
constexpr std::size_t kMaxRecord = 4096;

CloneGuardian* g_current = nullptr;

// What the guardian was told: the helpers (a pidfd each, opened when told,
// so a PID reused later is never taken for one), the clones, the scratches.
struct Guarded {
    std::vector<int> helpers;
    std::vector<std::string> clones, scratches, claims;
    std::vector<PodmanObject> podman;
};

// Takes one record; true on a release.
bool take_record(const char* record, std::size_t size, Guarded& guarded) {
    RecordHeader h;
    if (size < sizeof h) return false;
    std::memcpy(&h, record, sizeof h);
    if (size != sizeof h + h.length) return false;
    const std::string payload(record + sizeof h, h.length);
    if (h.kind == kRelease) return true;
    if (h.kind == kClone) guarded.clones.push_back(payload);
    if (h.kind == kScratch) guarded.scratches.push_back(payload);
    if (h.kind == kClaim) guarded.claims.push_back(payload);
    if (const auto space = payload.find(' '); h.kind == kPodman && space != std::string::npos)
        guarded.podman.push_back({payload.substr(0, space), payload.substr(space + 1)});
    if (h.kind == kChild && payload.size() == sizeof(std::int32_t)) {
        std::int32_t pid;
        std::memcpy(&pid, payload.data(), sizeof pid);
        // Gone already (ESRCH): nothing to wait for.
        const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
        if (pidfd >= 0) guarded.helpers.push_back(pidfd);
    }
    return false;
}

// A helper's pidfd turns readable when it has ended.  CRIU is never killed:
// cut off mid-dump it would leave production frozen or its parasite code
// inside; it finishes, resumes production (leave-running) and exits.
void wait_for_helpers(const std::vector<int>& helpers) {
    for (const int pidfd : helpers) {
        pollfd p{pidfd, POLLIN, 0};
        while (::poll(&p, 1, -1) < 0 && errno == EINTR) {
        }
        ::close(pidfd);
    }
}

[[noreturn]] void guardian_main(int socket) {
    // Out of the terminal's reach (a Ctrl-C is the launcher's to handle);
    // never ended with its launcher.
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, 0, 0, 0, 0);
    ::prctl(PR_SET_NAME, "iprobe-guardian", 0, 0, 0);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::signal(SIGINT, SIG_IGN);
    ::signal(SIGHUP, SIG_IGN);
    ::signal(SIGPIPE, SIG_IGN);
    // Its own helpers (`ip netns delete`) note themselves to nobody.
    note_children_to(-1);
    // Nothing of the launcher's is held: not its stdout (a reader waiting
    // for EOF), not a debug session's lifeline (its keepers wait for EOF).
    const int socket_high = ::fcntl(socket, F_DUPFD, 10);
    stdio_to_dev_null();
    ::dup2(socket_high, kSocketFd);
    ::close_range(kSocketFd + 1, ~0U, 0);

    Guarded guarded;
    char record[kMaxRecord];
    for (;;) {
        const ssize_t n = ::recv(kSocketFd, record, sizeof record, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;  // every writer is gone: the launcher and its helpers
        if (take_record(record, static_cast<std::size_t>(n), guarded)) _exit(0);
    }
    wait_for_helpers(guarded.helpers);
    for (const auto& name : guarded.clones) {
        try {
            remove_guarded_clone(name, ::getpid());
        } catch (const std::exception&) {
            // removed meanwhile by its keeper, whose lifeline closed too
        }
    }
    remove_guarded_podman(guarded.podman);
    for (const auto& dir : guarded.scratches) remove_tree(dir);
    // Last: until now no other command could make a clone of these names,
    // whose objects the removals above, by name, would have taken.
    for (const auto& name : guarded.claims) {
        try {
            drop_guardians_claim(name, ::getpid());
        } catch (const std::exception&) {
            // left stale: the next claimer takes it over
        }
    }
    _exit(0);
}

}  // namespace

CloneGuardian::CloneGuardian() {
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) < 0) throw_errno("socketpair");
    const pid_t pid = ::fork();
    if (pid < 0) {
        ::close(fds[0]);
        ::close(fds[1]);
        throw_errno("fork");
    }
    if (pid == 0) guardian_main(fds[0]);
    ::close(fds[0]);
    pid_ = pid;
    started_ = start_time(pid);
    socket_ = fds[1];
    note_children_to(socket_);
    g_current = this;
}

CloneGuardian::~CloneGuardian() { release(); }

CloneGuardian* CloneGuardian::current() { return g_current; }

void CloneGuardian::send(std::uint32_t kind, const std::string& payload) {
    if (socket_ < 0) return;
    if (sizeof(RecordHeader) + payload.size() > kMaxRecord)
        throw Error("clone guardian: record of " + std::to_string(payload.size()) + " bytes is too long");
    RecordHeader h{kind, static_cast<std::uint32_t>(payload.size())};
    std::string record(reinterpret_cast<const char*>(&h), sizeof h);
    record += payload;
    // A guardian killed by hand must not take the launcher with it (SIGPIPE).
    ssize_t n;
    while ((n = ::send(socket_, record.data(), record.size(), MSG_NOSIGNAL)) < 0 && errno == EINTR) {
    }
    if (n != static_cast<ssize_t>(record.size())) throw_errno("telling the clone's guardian");
}

void CloneGuardian::guard_clone(const std::string& name) { send(kClone, name); }

void CloneGuardian::guard_scratch(const std::string& dir) { send(kScratch, dir); }

void CloneGuardian::guard_claim(const std::string& name) { send(kClaim, name); }

void CloneGuardian::guard_podman(const std::string& kind, const std::string& name) {
    send(kPodman, kind + " " + name);
}

void CloneGuardian::release() {
    if (socket_ < 0) return;
    note_children_to(-1);
    if (g_current == this) g_current = nullptr;
    try {
        send(kRelease, {});
    } catch (const Error&) {
        // it is gone (killed by hand): nothing to release
    }
    ::close(socket_);
    socket_ = -1;
    int status;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
}

}  // namespace iprobe::launcher::clone_steps
