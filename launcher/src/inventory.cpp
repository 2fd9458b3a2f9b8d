#include "iprobe/launcher/inventory.h"

#include <algorithm>

#include "iprobe/launcher/container.h"
#include "iprobe/launcher/remote.h"
#include "iprobe/proxy/address.h"
#include "iprobe/support/error.h"
#include "criu.h"
#include "name_claim.h"

namespace iprobe::launcher {
namespace {

InventoryEntry entry_of(const std::string& kind, const CloneResult& r, const std::string& where) {
    InventoryEntry e;
    e.kind = kind;
    e.name = r.name;
    e.where = where;
    e.clone_pid = r.clone_pid;
    e.running = r.keeper_pid > 0;
    e.freezing_ms = r.freezing_ms;
    e.freeze_ms = r.freeze_ms;
    e.unavailable_ms = r.freezing_ms + r.freeze_ms;
    e.checkpoint_ms = r.dump_ms;
    e.restore_ms = r.restore_ms;
    e.total_ms = r.total_ms;
    return e;
}

// An agent listening on a wildcard address is reached on loopback here.
std::string reachable(const std::string& listen) {
    const proxy::Endpoint at = proxy::parse_endpoint(listen, "agent address");
    if (listen.rfind("0.0.0.0:", 0) == 0) return "127.0.0.1:" + std::to_string(at.port());
    if (listen.rfind("[::]:", 0) == 0) return "[::1]:" + std::to_string(at.port());
    return listen;
}

// Recorded whole by the command that made it (a local clone's keeper runs):
// not one that command is still making.
bool made_whole(const std::string& name) {
    if (is_container_clone(name)) return true;
    for (const auto& r : remote_clones())
        if (r.clone.name == name) return true;
    try {
        return load_clone(name).keeper_pid > 0;
    } catch (const Error&) {
        return false;  // no local clone of that name
    }
}

// Clones other commands are making now: marked in `out`, or added to it
// when nothing of theirs is recorded yet.
void add_clones_being_made(std::vector<InventoryEntry>& out) {
    for (const auto& name : clone_steps::names_claimed_elsewhere()) {
        const auto holder = clone_steps::claimed_elsewhere(name);
        if (!holder) continue;  // ended meanwhile
        const auto listed = std::find_if(out.begin(), out.end(),
                                         [&](const auto& e) { return e.name == name && e.kind == holder->kind; });
        if (listed != out.end()) {
            listed->being_made = !listed->running;
            continue;
        }
        InventoryEntry e;
        e.kind = holder->kind;
        e.name = name;
        e.where = holder->doing();
        e.being_made = true;
        out.push_back(e);
    }
}

}  // namespace

std::vector<InventoryEntry> list_every_clone() {
    std::vector<InventoryEntry> out;
    for (const auto& name : list_clones()) out.push_back(entry_of("local", load_clone(name), netns_path_of_clone(name)));
    for (const auto& name : list_container_clones()) {
        const auto c = load_container_clone(name);
        if (!c) continue;
        InventoryEntry e;
        e.kind = "container";
        e.name = name;
        e.where = "podman network " + c->network + ", " + c->address;
        e.clone_pid = c->clone_pid;
        e.running = c->clone_pid > 0 && container_running(c->id);
        e.freezing_ms = c->freezing_ms;
        e.freeze_ms = c->freeze_ms;
        e.unavailable_ms = c->freezing_ms + c->freeze_ms;
        e.checkpoint_ms = c->checkpoint_ms;
        e.restore_ms = c->restore_ms;
        e.total_ms = c->total_ms;
        out.push_back(e);
    }
    for (const auto& r : remote_clones()) {
        InventoryEntry e = entry_of("remote", r.clone, "agent " + r.agent);
        e.running = true;  // as last known: it runs on the other host
        out.push_back(e);
    }
    for (const auto& a : agent_held_clones()) out.push_back(entry_of("agent", a.clone, "agent " + a.agent + ", " + a.state_dir));
    add_clones_being_made(out);
    std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
    return out;
}

namespace {

std::vector<Removed> destroy_recorded_clone(const std::string& name) {
    for (const auto& r : remote_clones())
        if (r.clone.name == name) {
            try {
                destroy_agent_clone(r.agent, name);
            } catch (const Error& e) {
                // The agent is gone (it takes its clones along when it
                // stops) or no longer holds the clone: only the note is left.
                forget_remote_clone(name);
                return {{"record", "the note of remote clone " + name + " (the agent at " + r.agent +
                                       " did not remove it: " + e.what() + ")"}};
            }
            return {{"remote", name + " on the agent at " + r.agent}};
        }
    if (is_container_clone(name)) return destroy_container_clone(name);
    for (const auto& a : agent_held_clones())
        if (a.clone.name == name) {
            destroy_agent_clone(reachable(a.agent), name);
            return {{"agent", name + " held by the agent at " + a.agent + " (" + a.state_dir + ")"}};
        }
    return destroy_clone(name);
}

}  // namespace

std::vector<Removed> destroy_any_clone(const std::string& name) {
    validate_name(name);
    // Half made, its objects are its maker's to undo: removed from under it,
    // they would be made again, or its undo would fail.
    if (const auto holder = clone_steps::claimed_elsewhere(name); holder && !made_whole(name))
        throw Error("clone '" + name + "' is " + holder->doing() +
                        (holder->launcher_runs ? "; wait for it to end (then --destroy it) or interrupt it (Ctrl-C: "
                                                 "it removes what it made)"
                                               : "; try again once it has"),
                    ExitCode::busy);
    std::vector<Removed> removed;
    try {
        removed = destroy_recorded_clone(name);
    } catch (const Error& e) {
        // Only the claim of a command killed with its guardian may be left.
        if (e.code() != ExitCode::not_found) throw;
        const std::string claim = clone_steps::drop_stale_claim(name);
        if (claim.empty()) throw;
        return {{"claim", claim}};
    }
    if (const std::string claim = clone_steps::drop_stale_claim(name); !claim.empty())
        removed.push_back({"claim", claim});
    return removed;
}

}  // namespace iprobe::launcher
