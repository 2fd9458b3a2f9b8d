#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "commands.h"
#include "iprobe/launcher/clone.h"
#include "iprobe/launcher/container.h"
#include "iprobe/launcher/inventory.h"
#include "iprobe/launcher/remote.h"
#include "iprobe/support/args.h"
#include "iprobe/support/error.h"
#include "iprobe/support/glob.h"
#include "iprobe/support/json.h"

namespace iprobe::launcher::cli {
namespace {

const ArgSpec kSpec(
    "iprobe clone",
    "usage: iprobe clone PID [--netns NAME] [--fs-snapshot PATHS] [--no-default-snapshots]\n"
    "                        [--keep-images DIR] [--ping] [--json]\n"
    "       iprobe clone PID --to HOST:PORT [--netns NAME] [--fs-snapshot PATHS] [--ping] [--json]\n"
    "       iprobe clone --container CONTAINER [--netns NAME] [--ping] [--json]\n"
    "       iprobe clone --destroy NAME [--to HOST:PORT] [--json]\n"
    "       iprobe clone --list [--json]",
    "Makes a live copy of a running service with CRIU: production is checkpointed\n"
    "and keeps running (frozen only while CRIU copies its memory); the copy runs in\n"
    "its own network namespace NAME (default iprobe-clone-PID; created if needed,\n"
    "loopback up, the same addresses and listening ports inside) and its own PID\n"
    "namespace. Established TCP connections are restored closed; listening sockets\n"
    "are live. Enter it with `nsenter --net=/run/netns/NAME ...`.\n"
    "\n"
    "The clone writes private copies of the files the service writes: every regular\n"
    "file it has open for writing or maps shared and writable, its working\n"
    "directory (up to 256 MiB), and --fs-snapshot PATHS (comma-separated files or\n"
    "directories). It gets a /dev/shm of its own.",
    {
        {"--container", "CONTAINER", "clone a podman container instead: podman's own\n"
                                     "checkpoint (--leave-running) and restore as a new\n"
                                     "container NAME (default CONTAINER-iprobe-clone) alone\n"
                                     "on an isolated podman network iprobe-NAME, through\n"
                                     "iprobe's CRIU"},
        {"--to", "HOST:PORT", "clone onto another host, to the `iprobe clone-agent`\n"
                              "listening there: memory streams to a CRIU page server\n"
                              "on that host, the clone runs in that host's network\n"
                              "(PIDs printed are that host's)"},
        {"--netns", "NAME", "clone and namespace name"},
        {"--fs-snapshot", "PATHS", "more files/directories to copy for the clone"},
        {"--no-default-snapshots", "", "copy only --fs-snapshot paths"},
        {"--keep-images", "DIR", "keep the checkpoint in DIR (must be empty): CRIU's images,\n"
                                 "the file copies and checkpoint.json"},
        {"--destroy", "NAME", "remove clone NAME, whatever its kind (and what a killed\n"
                              "iprobe left of it); says what it removed; refused\n"
                              "(exit 6) while another command is making it"},
        {"--list", "", "every clone on this host, of every kind: local, --container,\n"
                       "--to (made here, running elsewhere), and those an\n"
                       "iprobe clone-agent here holds for other hosts; one\n"
                       "another command is making is `being made`"},
        {"--ping", "", "also measure the freeze as a client of production feels it\n"
                       "(RESP services): a PING every 1 ms on a connection of its\n"
                       "own while the checkpoint is taken (client_seen_us);\n"
                       "production serves those PINGs too"},
        {"--json", "", "machine-readable output"},
    },
    "Needs root and CRIU >= 4.2 (scripts/setup installs it; IPROBE_CRIU overrides).\n"
    "Exit codes: 0 ok, 1 CRIU failed (production untouched), 2 usage, 4 not root,\n"
    "5 no such process/container/clone, 6 clone name in use or being made by another\n"
    "iprobe (which the name's claim, /run/iprobe/claims/NAME, names), 7 CRIU or podman missing\n"
    "(or a container bind-mounts host files read-write: refused before the freeze),\n"
    "130 interrupted (Ctrl-C, SIGTERM, SIGHUP: the checkpoint runs to its end, then\n"
    "what was made of the clone is removed).");

std::int64_t us(double ms) { return static_cast<std::int64_t>(ms * 1e3 + 0.5); }

void print_container_result(const ContainerCloneResult& r, bool json) {
    if (json) {
        JsonWriter w;
        w.begin_object()
            .field("name", r.name)
            .field("container_id", r.id)
            .field("source", r.source)
            .field("address", r.address)
            .field("network", r.network)
            .field("clone_pid", static_cast<std::int64_t>(r.clone_pid))
            .field("unavailable_us", static_cast<std::int64_t>((r.freezing_ms + r.freeze_ms) * 1e3))
            .field("client_seen_us", r.client_seen_ms < 0 ? -1 : us(r.client_seen_ms))
            .field("freeze_us", static_cast<std::int64_t>(r.freeze_ms * 1e3))
            .field("freezing_us", static_cast<std::int64_t>(r.freezing_ms * 1e3))
            .field("checkpoint_us", static_cast<std::int64_t>(r.checkpoint_ms * 1e3))
            .field("restore_us", static_cast<std::int64_t>(r.restore_ms * 1e3))
            .field("total_us", static_cast<std::int64_t>(r.total_ms * 1e3))
            .field("pages_written", static_cast<std::uint64_t>(r.pages_written));
        w.key("ports").begin_object();
        for (const auto& [port, at] : r.ports) w.field(port, at);
        w.end_object();
        w.key("volumes").begin_object();
        for (const auto& [prod, copy] : r.volumes) w.field(prod, copy);
        w.end_object().end_object();
        std::printf("%s\n", w.str().c_str());
        return;
    }
    std::printf("clone %s (container %.12s) of container %s\n", r.name.c_str(), r.id.c_str(), r.source.c_str());
    std::printf("  address      %s on network %s (the clone's alone, isolated)\n", r.address.c_str(), r.network.c_str());
    for (const auto& [port, at] : r.ports)
        std::printf("  port         %s published at %s (production's host port is production's)\n", port.c_str(),
                    at.c_str());
    for (const auto& [prod, copy] : r.volumes)
        std::printf("  volume       %s: a copy of production's %s\n", copy.c_str(), prod.c_str());
    std::printf("  pid          %d (host)\n", r.clone_pid);
    std::printf("  unavailable  %.1f ms production could not answer (stopping it %.1f ms, frozen %.1f ms)\n",
                r.freezing_ms + r.freeze_ms, r.freezing_ms, r.freeze_ms);
    if (r.client_seen_ms >= 0)
        std::printf("  a client     waited %.1f ms at most for a reply (a PING every 1 ms)\n", r.client_seen_ms);
    std::printf("  time         checkpoint %.1f ms, restore %.1f ms, total %.1f ms\n", r.checkpoint_ms, r.restore_ms,
                r.total_ms);
}

void print_result(const CloneResult& r, bool json, bool alive_known = true) {
    if (json) {
        JsonWriter w;
        w.begin_object()
            .field("name", r.name)
            .field("netns", r.netns_path)
            .field("clone_pid", static_cast<std::int64_t>(r.clone_pid))
            .field("clone_pid_in_ns", static_cast<std::int64_t>(r.clone_pid_in_ns))
            .field("keeper_pid", static_cast<std::int64_t>(r.keeper_pid))
            .field("unavailable_us", us(r.freezing_ms + r.freeze_ms))
            .field("client_seen_us", r.client_seen_ms < 0 ? -1 : us(r.client_seen_ms))
            .field("freeze_us", us(r.freeze_ms))
            .field("freezing_us", us(r.freezing_ms))
            .field("dump_us", us(r.dump_ms))
            .field("restore_us", us(r.restore_ms))
            .field("total_us", us(r.total_ms))
            .field("pages_written", static_cast<std::uint64_t>(r.pages_written));
        w.key("snapshots").begin_array();
        for (const auto& s : r.snapshots) w.value(s);
        w.end_array();
        if (!r.images_dir.empty()) w.field("images", r.images_dir);
        if (!alive_known) w.field("running", r.keeper_pid > 0);
        w.end_object();
        std::printf("%s\n", w.str().c_str());
        return;
    }
    std::printf("clone %s\n", r.name.c_str());
    std::printf("  pid          %d (host), %d inside its PID namespace\n", r.clone_pid, r.clone_pid_in_ns);
    if (r.netns_path.rfind("agent ", 0) == 0)
        std::printf("  host         %s (its network; these PIDs are that host's)\n", r.netns_path.c_str() + 6);
    else
        std::printf("  netns        %s   (enter: nsenter --net=%s ...)\n", r.netns_path.c_str(), r.netns_path.c_str());
    std::printf("  unavailable  %.1f ms production could not answer (stopping it %.1f ms, frozen %.1f ms)\n",
                r.freezing_ms + r.freeze_ms, r.freezing_ms, r.freeze_ms);
    if (r.client_seen_ms >= 0)
        std::printf("  a client     waited %.1f ms at most for a reply (a PING every 1 ms)\n", r.client_seen_ms);
    std::printf("  time         dump %.1f ms, restore %.1f ms, total %.1f ms\n", r.dump_ms, r.restore_ms, r.total_ms);
    for (const auto& s : r.snapshots) std::printf("  private copy %s\n", s.c_str());
    if (!r.images_dir.empty()) std::printf("  images       %s\n", r.images_dir.c_str());
    if (!alive_known && r.keeper_pid <= 0) std::printf("  state        not running (remove with --destroy)\n");
}

void print_inventory(const std::vector<InventoryEntry>& clones, bool json) {
    if (json) {
        JsonWriter w;
        w.begin_array();
        for (const auto& c : clones) {
            w.begin_object().field("name", c.name).field("kind", c.kind).field("where", c.where);
            w.field("clone_pid", static_cast<std::int64_t>(c.clone_pid)).field("running", c.running);
            w.field("unavailable_us", us(c.unavailable_ms)).field("freezing_us", us(c.freezing_ms));
            w.field("freeze_us", us(c.freeze_ms)).field("checkpoint_us", us(c.checkpoint_ms));
            w.field("restore_us", us(c.restore_ms)).field("total_us", us(c.total_ms));
            w.field("being_made", c.being_made).end_object();
        }
        w.end_array();
        std::printf("%s\n", w.str().c_str());
        return;
    }
    if (clones.empty()) {
        std::printf("no clones\n");
        return;
    }
    std::printf("%-28s %-9s %8s %-10s %11s %13s %10s %9s  %s\n", "NAME", "KIND", "PID", "STATE", "UNAVAIL ms",
                "CHECKPOINT ms", "RESTORE ms", "TOTAL ms", "WHERE");
    for (const auto& c : clones)
        std::printf("%-28s %-9s %8d %-10s %11.1f %13.1f %10.1f %9.1f  %s\n", c.name.c_str(), c.kind.c_str(), c.clone_pid,
                    c.running ? "running" : c.being_made ? "being made" : "remains", c.unavailable_ms, c.checkpoint_ms,
                    c.restore_ms, c.total_ms, c.where.c_str());
}

void print_removed(const std::string& name, const std::vector<Removed>& removed, bool json) {
    if (json) {
        JsonWriter w;
        w.begin_object().field("destroyed", name).key("removed").begin_array();
        for (const auto& r : removed) w.begin_object().field("kind", r.kind).field("what", r.what).end_object();
        w.end_array().end_object();
        std::printf("%s\n", w.str().c_str());
        return;
    }
    std::printf("clone %s destroyed\n", name.c_str());
    for (const auto& r : removed) std::printf("  removed %-10s %s\n", r.kind.c_str(), r.what.c_str());
}

}  // namespace

int clone_main(const std::vector<std::string>& args) {
    const auto parsed = kSpec.parse_or_print_help(args);
    if (!parsed) return 0;
    const ParsedArgs& a = *parsed;
    CloneOptions o;
    const bool json = a.has("--json"), list = a.has("--list");
    const std::string destroy = a.value("--destroy"), container = a.value("--container"), to = a.value("--to");
    o.name = a.value("--netns");
    for (const auto& paths : a.values("--fs-snapshot"))
        for (auto& p : split_list(paths)) o.fs_snapshot.push_back(p);
    o.default_snapshots = !a.has("--no-default-snapshots");
    o.keep_images = a.value("--keep-images");
    o.client_view = a.has("--ping");
    if (a.positionals().size() > 1) kSpec.fail("unexpected argument '" + a.positionals()[1] + "'");
    if (!a.positionals().empty()) o.pid = parse_pid(a.positionals().front());
    if (!destroy.empty()) {
        std::vector<Removed> removed;
        if (!to.empty()) {
            destroy_agent_clone(to, destroy);
            removed.push_back({"agent-clone", destroy + " on " + to});
        } else {
            removed = destroy_any_clone(destroy);
        }
        print_removed(destroy, removed, json);
        return 0;
    }
    if (list) {
        print_inventory(list_every_clone(), json);
        return 0;
    }
    if (!container.empty()) {
        if (!to.empty()) throw Error("--to clones a process, not a container (--container)", ExitCode::usage);
        if (o.pid >= 0) kSpec.fail("give a PID or --container, not both");
        ContainerCloneOptions c{container, o.name, {}, o.client_view};
        if (!json) c.progress = [](const std::string& line) { std::fprintf(stderr, "iprobe clone: %s\n", line.c_str()); };
        print_container_result(clone_container(c), json);
        return 0;
    }
    if (o.pid < 0) kSpec.fail("missing PID");
    if (!to.empty() && !o.keep_images.empty())
        throw Error("--keep-images and --to exclude each other: the images are kept by the agent's host", ExitCode::usage);
    if (!json) o.progress = [](const std::string& line) { std::fprintf(stderr, "iprobe clone: %s\n", line.c_str()); };
    print_result(to.empty() ? clone_process(o) : clone_to_agent(o, to), json);
    return 0;
}

}  // namespace iprobe::launcher::cli
