#include "name_claim.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include "clone_guardian.h"
#include "clone_steps.h"
#include "iprobe/support/error.h"
#include "iprobe/support/fd.h"

namespace fs = std::filesystem;

namespace iprobe::launcher::clone_steps {
namespace {

std::string claim_file(const std::string& name) { return std::string(kClaimRoot) + "/" + name; }

// Every claimer's check-and-write, and every release, under one flock of
// the claims directory: held for the few microseconds each takes, released
// by the kernel with a process killed holding it.
class ClaimsLocked {
public:
    ClaimsLocked() {
        fs::create_directories(kClaimRoot);
        fd_.reset(::open(kClaimRoot, O_RDONLY | O_DIRECTORY | O_CLOEXEC));
        if (!fd_) throw_errno(std::string("opening ") + kClaimRoot);
        while (::flock(fd_.get(), LOCK_EX) != 0)
            if (errno != EINTR) throw_errno(std::string("locking ") + kClaimRoot);
    }

private:
    UniqueFd fd_;
};

bool is_mine(const State& claim) {
    const auto pid = claim.find("launcher_pid"), start = claim.find("launcher_start");
    return pid != claim.end() && start != claim.end() && to_pid(pid->second) == ::getpid() &&
           start->second == start_time(::getpid());
}

bool live(const State& claim) {
    return alive_as_recorded(claim, "launcher_pid", "launcher_start") ||
           alive_as_recorded(claim, "guardian_pid", "guardian_start");
}

std::string value(const State& st, const char* key) {
    const auto it = st.find(key);
    return it == st.end() ? std::string() : it->second;
}

[[noreturn]] void refuse_held(const std::string& name, const State& claim) {
    const std::string kind = value(claim, "kind").empty() ? "" : value(claim, "kind") + " ";
    if (alive_as_recorded(claim, "launcher_pid", "launcher_start"))
        throw Error("clone name '" + name + "' is taken: a " + kind + "clone of that name is being made by " +
                        "iprobe PID " + value(claim, "launcher_pid") + "; pick another --netns name, or wait for it " +
                        "to end and remove its clone with `iprobe clone --destroy " + name + "`",
                    ExitCode::busy);
    throw Error("clone name '" + name + "' is taken: the iprobe (PID " + value(claim, "launcher_pid") +
                    ") that was making a " + kind + "clone of that name was killed, and its guardian (PID " +
                    value(claim, "guardian_pid") + ") is removing what it made; try again once it has",
                ExitCode::busy);
}

// A clone of another kind recorded under `name` (a container clone, a --to
// clone's note, a local clone's state): one name names one clone.
void refuse_recorded_elsewhere(const std::string& name, const std::string& kind) {
    std::string other;
    if (kind != "local" && fs::exists(state_dir(name) + "/state")) other = "local";
    if (kind != "container" && fs::exists(std::string(kContainerStateRoot) + "/" + name)) other = "container";
    if (kind != "remote" && fs::exists(std::string(kRemoteRoot) + "/" + name)) other = "remote";
    if (!other.empty())
        throw Error("a " + other + " clone named '" + name + "' exists; remove it with `iprobe clone --destroy " +
                        name + "` or pick another --netns name",
                    ExitCode::busy);
}

}  // namespace

NameClaim::NameClaim(const std::string& name, const std::string& kind, CloneGuardian* guardian) {
    const ClaimsLocked locked;
    const std::string file = claim_file(name);
    if (const auto held = read_state_file(file)) {
        if (is_mine(*held)) return;  // the outer claim of this process releases it
        if (live(*held)) refuse_held(name, *held);
        // Stale: its launcher and guardian are gone; taken over.
    }
    refuse_recorded_elsewhere(name, kind);
    State claim;
    claim["name"] = name;
    claim["kind"] = kind;
    claim["launcher_pid"] = std::to_string(::getpid());
    claim["launcher_start"] = start_time(::getpid());
    if (guardian) {
        claim["guardian_pid"] = std::to_string(guardian->pid());
        claim["guardian_start"] = guardian->started();
        // Told before the claim exists: killed from here on, this launcher
        // leaves its guardian to drop it, last.
        guardian->guard_claim(name);
    }
    write_state_file(file, claim);
    name_ = name;
}

NameClaim::~NameClaim() {
    if (name_.empty()) return;
    try {
        const ClaimsLocked locked;
        const auto held = read_state_file(claim_file(name_));
        if (held && is_mine(*held)) ::unlink(claim_file(name_).c_str());
    } catch (const std::exception&) {
        // the claim stays, stale once this process has ended: taken over then
    }
}

std::string ClaimHolder::doing() const {
    return launcher_runs ? "being made by iprobe PID " + std::to_string(launcher)
                         : "being removed by the guardian of iprobe PID " + std::to_string(launcher) + " (killed)";
}

std::optional<ClaimHolder> claimed_elsewhere(const std::string& name) {
    const auto held = read_state_file(claim_file(name));
    if (!held || is_mine(*held) || !live(*held)) return std::nullopt;
    return ClaimHolder{value(*held, "kind"), to_pid(value(*held, "launcher_pid")),
                       alive_as_recorded(*held, "launcher_pid", "launcher_start")};
}

std::vector<std::string> names_claimed_elsewhere() {
    std::vector<std::string> names;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(kClaimRoot, ec)) {
        const std::string name = e.path().filename().string();
        // write_file_atomic's temporary files are NAME.iprobe-tmp.PID
        if (name.find(".iprobe-tmp.") == std::string::npos && claimed_elsewhere(name)) names.push_back(name);
    }
    return names;
}

std::string drop_stale_claim(const std::string& name) {
    const ClaimsLocked locked;
    const auto held = read_state_file(claim_file(name));
    if (!held || live(*held)) return {};
    ::unlink(claim_file(name).c_str());
    return claim_file(name);
}

void drop_guardians_claim(const std::string& name, pid_t guardian) {
    const ClaimsLocked locked;
    const auto held = read_state_file(claim_file(name));
    // Not asked whether the launcher still runs: its end of the guardian's
    // socket is closed before the kernel has finished ending it.
    if (held && to_pid(value(*held, "guardian_pid")) == guardian) ::unlink(claim_file(name).c_str());
}

}  // namespace iprobe::launcher::clone_steps
