// A clone's name, claimed for the command that makes it
// (docs/debug-container.md, "One name, one maker"): two commands started at
// once for one name (`iprobe clone PID --netns X`, `--container C --netns X`,
// `--to HOST:PORT --netns X`, a debug session's clones) must not both pass
// their "is the name free?" check and collide later, when the loser's undo
// and its guardian (which remove by name) would take the winner's clone
// with them.  The claim is a file, /run/iprobe/claims/NAME, naming the
// launcher and its guardian (PID and start time); it is taken under an
// flock of that directory, so checking it and writing it are one step for
// every other claimer.  It is honoured while either process runs as
// recorded; a claim whose launcher and guardian are both gone (killed
// outright, guardian included) is stale and taken over.  The launcher
// removes it when it ends; a launcher killed outright leaves it to its
// guardian, which removes it after everything else.  Internal to the
// launcher.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

namespace iprobe::launcher::clone_steps {

class CloneGuardian;

// Who holds a live claim.
struct ClaimHolder {
    std::string kind;   // "local", "container", "remote"
    pid_t launcher = -1;
    // false: the launcher was killed and its guardian is removing what it made
    bool launcher_runs = true;
    // "being made by iprobe PID N", or what its guardian is doing
    std::string doing() const;
};

class NameClaim {
public:
    // Claims `name` for a clone of `kind` made by this process, whose
    // `guardian` (nullptr: none) is told of the claim.  Throws Error(busy)
    // with who holds it when a live launcher or guardian does, or when a
    // clone of another kind is recorded under that name; changes nothing
    // then.  A claim this process holds already yields an empty NameClaim
    // (the outer one releases it).
    NameClaim(const std::string& name, const std::string& kind, CloneGuardian* guardian);
    NameClaim() = default;
    // Removes the claim if it still names this process.
    ~NameClaim();
    NameClaim(NameClaim&& other) noexcept : name_(std::move(other.name_)) { other.name_.clear(); }
    NameClaim& operator=(NameClaim&&) = delete;
    NameClaim(const NameClaim&) = delete;

private:
    std::string name_;  // empty: nothing to release
};

// The live claim on `name` of a process other than this one.
std::optional<ClaimHolder> claimed_elsewhere(const std::string& name);

// The names with a live claim of a process other than this one.
std::vector<std::string> names_claimed_elsewhere();

// For `--destroy NAME`, once it removed the clone's remains: drops a claim
// on `name` whose launcher and guardian are both gone (killed by hand);
// returns its path then, "" when there was none.
std::string drop_stale_claim(const std::string& name);

// For the guardian, once it removed what its launcher (killed outright)
// made: drops the claim on `name` if it names guardian `guardian`.
void drop_guardians_claim(const std::string& name, pid_t guardian);

}  // namespace iprobe::launcher::clone_steps
