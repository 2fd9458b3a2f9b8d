// Every clone on this host, of every kind, in one list, and one way to
// remove any of them: `iprobe clone --list` and `--destroy`.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "iprobe/launcher/clone.h"

namespace iprobe::launcher {

struct InventoryEntry {
    // "local" (iprobe clone PID, iprobe debug's clones), "container"
    // (--container), "remote" (made here with --to, runs on another host),
    // "agent" (held here by an iprobe clone-agent for another host).
    std::string kind;
    std::string name;
    std::string where;       // network namespace, podman network, agent address
    pid_t clone_pid = -1;    // as the host it runs on sees it
    bool running = false;    // false: only remains (remove with --destroy); remote: as last known
    // Another command is making it now (it holds the name's claim): not
    // running yet, and not remains; --destroy refuses it until that ends.
    bool being_made = false;
    // Milliseconds.  unavailable = stopping production + frozen: the time
    // production could not answer, as its clients saw it.  checkpoint is the
    // dump (or podman's checkpoint), restore the restore, total the making
    // command's whole time (>= checkpoint + restore); 0 where not known
    // (an agent knows only its restore).
    double unavailable_ms = 0, freezing_ms = 0, freeze_ms = 0, checkpoint_ms = 0, restore_ms = 0, total_ms = 0;
};

std::vector<InventoryEntry> list_every_clone();

// Removes the clone `name`, whatever its kind (remains of a killed launcher
// included); returns what it removed.  Error(not_found) when there is none,
// Error(busy) when another command is making it.
std::vector<Removed> destroy_any_clone(const std::string& name);

}  // namespace iprobe::launcher
