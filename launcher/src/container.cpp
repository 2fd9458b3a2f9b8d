#include "iprobe/launcher/container.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "client_pinger.h"
#include "clone_guardian.h"
#include "clone_steps.h"
#include "criu.h"
#include "name_claim.h"
#include "iprobe/launcher/clone.h"
#include "iprobe/launcher/podman_json.h"
#include "iprobe/support/error.h"
#include "iprobe/support/json.h"
#include "process.h"

namespace fs = std::filesystem;

namespace iprobe::launcher {
using clone_steps::CloneGuardian;
using clone_steps::NameClaim;
namespace {

// Which clones are containers, and their IDs (under kContainerStateRoot):
// so --destroy removes only containers iprobe made.
using clone_steps::kContainerStateRoot;

std::string state_file(const std::string& name) { return std::string(kContainerStateRoot) + "/" + name; }

using Json = nlohmann::json;

// `podman container inspect NAME`'s container, or nullopt when podman
// knows none of that name.  Throws Error(failure) when podman answers
// something that is not its inspect JSON.
std::optional<podman::Container> inspect_container(const std::string& podman, const std::string& container) {
    const RunResult r = run({podman, "container", "inspect", container});
    if (!r.ok()) return std::nullopt;
    try {
        return podman::parse_inspect(r.out);
    } catch (const Error& e) {
        throw Error("cannot read `podman container inspect " + container + "`: " + e.what(), ExitCode::failure);
    }
}

void progress(const ContainerCloneOptions& o, const std::string& line) {
    if (o.progress) o.progress(line);
}

std::string podman_path() {
    std::string podman = find_program("podman");
    if (podman.empty())
        throw Error("podman not found: cloning a container uses podman's checkpoint/restore (scripts/setup installs "
                    "podman and runc)",
                    ExitCode::unavailable);
    return podman;
}

std::string trimmed(std::string s) {
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    return s;
}

// A scratch directory holding the checkpoint archive and a `criu` that is
// iprobe's CRIU, first on the PATH the OCI runtime searches (runc and crun
// both run `criu` from PATH; the system's may be too old for the kernel).
// The archive holds production's memory: removed with the directory, by
// the guardian (told before it is made) should the launcher be killed.
class Workspace {
public:
    Workspace(const Criu& criu, CloneGuardian& guardian, const std::string& clone)
        : dir_(std::string(kContainerStateRoot) + "/.work-" + clone + "-" + std::to_string(::getpid())) {
        fs::create_directories(kContainerStateRoot);
        guardian.guard_scratch(dir_);
        clone_steps::remove_tree(dir_);  // left by a launcher of this PID killed before guardians existed
        if (::mkdir(dir_.c_str(), 0700) != 0) throw_errno("creating " + dir_);
        // Connections production has open are not dumped: the clone's come
        // back closed, as with `iprobe clone`.  Set in the shim: podman
        // gives the runtime an environment of its own making.
        std::ofstream(dir_ + "/criu.conf") << "tcp-close\n";
        {
            std::ofstream shim(dir_ + "/criu");
            shim << "#!/bin/sh\nCRIU_CONFIG_FILE='" << dir_ << "/criu.conf' exec '" << criu.path << "' \"$@\"\n";
        }
        fs::permissions(dir_ + "/criu", fs::perms::owner_all);
    }
    ~Workspace() { remove(); }
    void remove() { clone_steps::remove_tree(dir_); }
    Workspace(const Workspace&) = delete;
    Workspace& operator=(const Workspace&) = delete;

    std::string archive() const { return dir_ + "/checkpoint.tar"; }
    const std::string& dir() const { return dir_; }
    // `podman ARGS` with iprobe's CRIU in front of the runtime's.
    std::vector<std::string> podman(const std::string& podman, std::vector<std::string> args) const {
        const char* path = std::getenv("PATH");
        std::vector<std::string> argv = {"env", "PATH=" + dir_ + ":" + (path ? path : "/usr/sbin:/usr/bin:/sbin:/bin"),
                                         podman};
        argv.insert(argv.end(), args.begin(), args.end());
        return argv;
    }

private:
    std::string dir_;
};

// The last container's CRIU statistics in `podman container checkpoint
// --print-stats` output (one container is checkpointed).
podman::CheckpointStats checkpoint_stats(const std::string& out) {
    try {
        return podman::parse_checkpoint_stats(out);
    } catch (const Error& e) {
        throw Error(std::string("podman checkpointed, but its --print-stats output is not what it prints: ") +
                    e.what());
    }
}

std::string podman_errors(const RunResult& r) {
    std::string said = trimmed(r.err.empty() ? r.out : r.err);
    return said.empty() ? "exit " + std::to_string(r.exit_code) : said;
}

}  // namespace

namespace {

// Podman 4.3 restores a checkpoint only onto the network it was taken on
// (into a pod only if the source was in one): the clone is moved afterwards
// onto a network of its own, isolated from every other podman network, so it
// can neither be reached by production's clients nor reach its backends.
// Returns the network's name, `network_of(clone)`; on failure the caller
// removes the clone and the network (RestoredClone).
std::string network_of(const std::string& clone) { return "iprobe-" + clone; }

std::string move_to_own_network(const std::string& podman, const std::string& clone) {
    const std::string network = network_of(clone);
    run({podman, "network", "rm", "--force", network});  // a remnant of a clone that died with its host
    const auto inspected = inspect_container(podman, clone);
    auto fail = [&](const std::string& what, const RunResult& why) {
        throw Error("could not give the clone a network of its own (" + what + "); production is untouched. podman says: " +
                        podman_errors(why),
                    ExitCode::failure);
    };
    if (!inspected) fail("inspect", run({podman, "container", "inspect", clone}));
    if (RunResult made = run({podman, "network", "create", "--opt", "isolate=true", network}); !made.ok())
        fail("network create", made);
    if (RunResult joined = run({podman, "network", "connect", network, clone}); !joined.ok()) fail("network connect", joined);
    for (const auto& [name, _] : inspected->networks)
        if (RunResult left = run({podman, "network", "disconnect", name, clone}); !left.ok())
            fail("network disconnect " + name, left);
    return network;
}

}  // namespace

namespace {

// What `podman container inspect` says of production, read before anything
// is frozen: whatever would make the restore collide with production or
// fail is known (and remapped, or refused) while production runs untouched.
struct Production {
    std::string id;
    bool running = false;
    std::vector<std::string> ports;  // published container ports, "6379/tcp"
    struct Volume {
        std::string name, source, destination;
    };
    std::vector<Volume> volumes;                  // named volumes
    std::vector<std::string> writable_binds;      // host directories bound read-write ("HOST -> DEST")
    // What podman's checkpoint leaves in production's own storage and keeps
    // until the container is removed: CRIU's images (production's memory)
    // and tars of its /dev/shm and of its root file system's changes.  Of
    // no use once the archive is exported: removed then.
    std::vector<std::string> checkpoint_leftovers;
};

Production inspect_production(const std::string& podman, const std::string& container) {
    const auto c = inspect_container(podman, container);
    if (!c) throw Error("no podman container '" + container + "' (`podman ps` lists them)", ExitCode::not_found);
    Production p;
    p.id = c->id;
    p.running = c->running;
    // Podman says where CRIU's images go only once a checkpoint was taken;
    // before, it is the same place, `checkpoint` in the container's StaticDir.
    if (!c->static_dir.empty())
        p.checkpoint_leftovers = {c->checkpoint_path.empty() ? c->static_dir + "/checkpoint" : c->checkpoint_path,
                                  c->static_dir + "/devshm-checkpoint.tar", c->static_dir + "/rootfs-diff.tar"};
    for (const auto& [port, bindings] : c->port_bindings)
        if (!bindings.empty()) p.ports.push_back(port);
    for (const auto& m : c->mounts) {
        if (m.type == "volume")
            p.volumes.push_back({m.name, m.source, m.destination});
        else if (m.type == "bind" && m.rw)
            p.writable_binds.push_back(m.source + " -> " + m.destination);
    }
    return p;
}

// The clone's own copy of each named volume, made before the freeze (and
// removed again on failure, or with the clone).  The guardian is told of
// each before podman makes it.
struct CloneVolumes {
    std::string podman;
    std::vector<std::pair<Production::Volume, std::string>> made;  // production's -> the clone's name
    bool keep = false;
    ~CloneVolumes() {
        if (keep) return;
        for (const auto& [_, name] : made) run({podman, "volume", "rm", "--force", name});
    }
    std::string mountpoint(const std::string& name) const {
        const std::string out = run_checked({podman, "volume", "inspect", name}, "finding volume " + name);
        try {
            return Json::parse(out).at(0).at("Mountpoint").get<std::string>();
        } catch (const Json::exception& e) {
            throw Error("cannot read `podman volume inspect " + name + "`: " + e.what());
        }
    }
};

// The checkpoint archive names production's volumes (config.dump and the
// runtime spec, spec.dump); the clone's must be mounted instead.  The
// archive is unpacked, both rewritten, and packed again (GNU tar's --delete
// and append yield an archive podman's restore then fails on).
void remap_volumes(const std::string& archive, const std::string& work, const CloneVolumes& volumes) {
    const std::string dir = work + "/unpacked";
    fs::create_directories(dir);
    run_checked({"tar", "-C", dir, "-xf", archive}, "unpacking the checkpoint archive");
    auto rewrite = [&](const std::string& file, const std::function<void(Json&)>& edit) {
        std::ifstream in(dir + "/" + file);
        Json doc = Json::parse(in, nullptr, false);
        if (doc.is_discarded()) throw Error("the checkpoint archive's " + file + " is not JSON");
        edit(doc);
        // podman's own document, edited in place: the one JSON not written
        // with JsonWriter, since it is re-emitted whole, fields we never read included.
        std::ofstream(dir + "/" + file) << doc.dump();
    };
    rewrite("config.dump", [&](Json& config) {
        for (auto& v : config["namedVolumes"])
            for (const auto& [prod, clone] : volumes.made)
                if (v.value("volumeName", "") == prod.name) v["volumeName"] = clone;
    });
    rewrite("spec.dump", [&](Json& spec) {
        for (auto& m : spec["mounts"])
            for (const auto& [prod, clone] : volumes.made)
                if (m.value("source", "") == prod.source) m["source"] = volumes.mountpoint(clone);
    });
    fs::remove(archive);
    run_checked({"tar", "-C", dir, "-cf", archive, "."}, "packing the checkpoint archive");
    fs::remove_all(dir);
}

// The restored clone container and its network: removed again unless kept
// (a failure, or an interrupt, after the restore began).
struct RestoredClone {
    std::string podman, name, network;
    bool keep = false;
    ~RestoredClone() {
        if (keep) return;
        if (!name.empty()) run({podman, "container", "rm", "--force", "--time", "1", name});
        if (!network.empty()) run({podman, "network", "rm", "--force", network});
    }
};

void save_container_state(const ContainerCloneResult& r) {
    JsonWriter j;
    j.begin_object().field("id", r.id).field("network", r.network).field("source", r.source);
    j.field("address", r.address).field("clone_pid", r.clone_pid).key("volumes").begin_array();
    for (const auto& [_, clone] : r.volumes) j.value(clone);
    j.end_array().field("freeze_ms", r.freeze_ms).field("freezing_ms", r.freezing_ms);
    j.field("checkpoint_ms", r.checkpoint_ms).field("restore_ms", r.restore_ms).field("total_ms", r.total_ms);
    std::ofstream(state_file(r.name)) << j.end_object().str() << "\n";
}

}  // namespace

ContainerCloneResult clone_container(const ContainerCloneOptions& o) {
    const double t0 = now_ms();
    require_root("iprobe clone --container");
    const std::string podman = podman_path();
    const Criu criu = find_criu();
    const Production prod = inspect_production(podman, o.container);
    if (!prod.running)
        throw Error("container '" + o.container + "' is not running: there is nothing live to clone", ExitCode::bad_input);

    ContainerCloneResult r;
    r.source = o.container;
    r.name = o.name.empty() ? o.container + "-iprobe-clone" : o.name;
    validate_name(r.name);
    // Everything that would fail after the freeze is refused before it.
    if (!prod.writable_binds.empty())
        throw Error("container '" + o.container + "' bind-mounts host files read-write (" + prod.writable_binds.front() +
                        "): a clone would write into production's files, and podman's checkpoint does not copy "
                        "them. Use a named volume (the clone gets a copy of it) or mount it read-only; production "
                        "is untouched",
                    ExitCode::unavailable);
    // From here on a Ctrl-C undoes what was made (podman, in a group of its
    // own, is never cut off), and a launcher killed outright leaves it to its
    // guardian, told of each thing before it is made: the volume copies, the
    // archive's directory, the clone container, its network, its record.
    // A debug session's guardian is its own, held until it removed the clone.
    InterruptGuard interrupts;
    std::optional<CloneGuardian> own_guardian;
    CloneGuardian* guardian = CloneGuardian::current();
    if (!guardian) guardian = &own_guardian.emplace();
    // The name is this command's from here until it returns (name_claim.h):
    // a second command for it stops here, having made nothing, and its
    // undo and guardian never remove what this one makes by that name.
    // Released after every undo below has run.
    const NameClaim claim(r.name, "container", guardian);
    if (run({podman, "container", "exists", r.name}).ok())
        throw Error("a container named '" + r.name + "' exists; remove it with `iprobe clone --destroy " + r.name +
                        "` (if iprobe made it) or pick another --netns name",
                    ExitCode::busy);
    CloneVolumes volumes{podman, {}};
    for (const auto& v : prod.volumes) {
        const std::string copy = "iprobe-" + r.name + "-" + v.name;
        if (run({podman, "volume", "exists", copy}).ok())
            throw Error("a podman volume named '" + copy + "' exists (left by a clone named " + r.name +
                            "?); remove it with `podman volume rm " + copy + "`",
                        ExitCode::busy);
        guardian->guard_podman("volume", copy);
        if (RunResult made = run({podman, "volume", "create", copy}); !made.ok())
            throw Error("cannot create the clone's copy of volume " + v.name + ": " + podman_errors(made) +
                        "; production is untouched");
        volumes.made.emplace_back(v, copy);
    }

    Workspace work(criu, *guardian, r.name);
    test_pause("workspace");
    throw_if_interrupted("the clone's volume copies were removed");
    progress(o, "checkpointing container " + o.container + " with podman and CRIU " + criu.version +
                    ", production keeps running");
    double t = now_ms();
    // Uncompressed: the archive lives only until the restore, and compressing
    // it (podman's default, zstd) made a 1 GB clone serve after 12.4 s, not 9.9.
    // Volumes are copied straight into the clone's (below), not exported.
    std::vector<std::string> checkpoint = {"container", "checkpoint", "--leave-running", "--print-stats",
                                           "--compress", "none", "--export", work.archive()};
    if (!volumes.made.empty()) checkpoint.push_back("--ignore-volumes");
    checkpoint.push_back(o.container);
    // Those there before are a checkpoint of someone else's until ours
    // replaces them; those not, ours alone, also for the guardian to remove.
    std::vector<std::string> ours_alone;
    for (const auto& f : prod.checkpoint_leftovers)
        if (!fs::exists(f)) {
            guardian->guard_scratch(f);
            ours_alone.push_back(f);
        }
    auto client = o.client_view ? ClientPinger::watch(container_main_pid(o.container)) : nullptr;
    RunResult dump = run(work.podman(podman, checkpoint));
    for (const auto& f : dump.ok() ? prod.checkpoint_leftovers : ours_alone) clone_steps::remove_tree(f);
    r.checkpoint_ms = now_ms() - t;
    r.client_seen_ms = client ? client->window_max_us() / 1e3 : -1;
    client.reset();
    if (!dump.ok())
        throw Error("podman could not checkpoint container '" + o.container +
                        "'; production keeps running. podman says: " + podman_errors(dump),
                    ExitCode::failure);
    throw_if_interrupted("the checkpoint archive and the clone's volume copies were removed");
    const podman::CheckpointStats stats = checkpoint_stats(dump.out);
    r.freeze_ms = stats.frozen_us / 1e3;
    r.freezing_ms = stats.freezing_us / 1e3;
    r.pages_written = static_cast<unsigned long long>(stats.pages_written);
    char frozen[128];
    std::snprintf(frozen, sizeof frozen, "production could not answer for %.1f ms (stopping it %.1f ms, frozen %.1f ms)",
                  r.freezing_ms + r.freeze_ms, r.freezing_ms, r.freeze_ms);
    progress(o, frozen);
    test_pause("exported");

    // Volumes: copied right after the checkpoint, production running on, so
    // the clone's files may be slightly ahead of its memory, never behind.
    for (const auto& [v, copy] : volumes.made) {
        run_checked({"cp", "-a", "--reflink=auto", v.source + "/.", volumes.mountpoint(copy) + "/"},
                    "copying volume " + v.name + " for the clone");
        r.volumes.emplace_back(v.name, copy);
    }
    if (!volumes.made.empty()) remap_volumes(work.archive(), work.dir(), volumes);

    progress(o, "restoring the clone as container " + r.name + " on a network of its own");
    std::vector<std::string> restore = {"container", "restore", "--import", work.archive(), "--name", r.name,
                                        "--ignore-static-ip", "--ignore-static-mac"};
    if (!volumes.made.empty()) restore.push_back("--ignore-volumes");
    // Production's host ports are taken: the clone publishes each of its
    // ports on a free loopback port instead (podman picks it).
    for (const auto& port : prod.ports) restore.insert(restore.end(), {"--publish", "127.0.0.1::" + port});
    throw_if_interrupted("the checkpoint archive and the clone's volume copies were removed");
    // Its name was free (checked above) and is claimed; whatever the
    // restore makes of it is removed unless kept.
    guardian->guard_podman("container", r.name);
    RestoredClone clone{podman, r.name, {}};
    t = now_ms();
    RunResult restored = run(work.podman(podman, restore));
    r.restore_ms = now_ms() - t;
    if (!restored.ok()) {
        throw Error("podman could not restore the clone; production is untouched. podman says: " +
                        podman_errors(restored),
                    ExitCode::failure);
    }
    test_pause("restored");
    throw_if_interrupted("the clone container, the checkpoint archive and the clone's volume copies were removed");
    clone.network = network_of(r.name);
    guardian->guard_podman("network", clone.network);
    r.network = move_to_own_network(podman, r.name);
    try {
        const auto c = inspect_container(podman, r.name);
        if (!c) throw Error("podman knows no container " + r.name + " any more");
        r.id = c->id;
        r.clone_pid = c->pid;
        const auto on_network = c->networks.find(r.network);
        if (on_network == c->networks.end()) throw Error("it is not on network " + r.network);
        r.address = on_network->second.ip_address;
        for (const auto& port : prod.ports) {
            const auto published = c->ports.find(port);
            if (published == c->ports.end() || published->second.empty())
                throw Error("podman published no host port for its " + port);
            r.ports.emplace_back(port, published->second.front().host_ip + ":" + published->second.front().host_port);
        }
    } catch (const Error& e) {
        throw Error("the restored clone " + r.name + " cannot be inspected: " + e.what());
    }
    throw_if_interrupted("the clone container, its network, the checkpoint archive and the clone's volume copies "
                         "were removed");
    r.total_ms = now_ms() - t0;
    // Recorded, then kept: killed in between, the guardian removes the
    // record with the rest.
    guardian->guard_scratch(state_file(r.name));
    save_container_state(r);
    test_pause("record");
    work.remove();
    volumes.keep = clone.keep = true;
    if (own_guardian) own_guardian->release();
    return r;
}

void clone_steps::remove_guarded_podman(const std::vector<PodmanObject>& objects) {
    const std::string podman = find_program("podman");
    if (podman.empty()) return;
    for (const char* kind : {"container", "network", "volume"})
        for (const auto& o : objects)
            if (o.kind == kind) run({podman, kind, "rm", "--force", o.name});
}

pid_t container_main_pid(const std::string& container) {
    const auto c = inspect_container(podman_path(), container);
    const pid_t pid = c && c->running ? c->pid : 0;
    if (pid <= 0) throw Error("no running podman container '" + container + "' (`podman ps` lists them)", ExitCode::not_found);
    return pid;
}

bool is_container_clone(const std::string& name) { return fs::exists(state_file(name)); }

std::optional<ContainerCloneResult> load_container_clone(const std::string& name) {
    std::ifstream in(state_file(name));
    const Json doc = Json::parse(in, nullptr, false);
    if (!doc.is_object()) return std::nullopt;
    ContainerCloneResult r;
    r.name = name;
    r.id = doc.value("id", "");
    r.network = doc.value("network", "");
    r.source = doc.value("source", "");
    r.address = doc.value("address", "");
    r.clone_pid = doc.value("clone_pid", -1);
    for (const auto& v : doc.value("volumes", Json::array())) r.volumes.emplace_back("", v.get<std::string>());
    r.freeze_ms = doc.value("freeze_ms", 0.0);
    r.freezing_ms = doc.value("freezing_ms", 0.0);
    r.checkpoint_ms = doc.value("checkpoint_ms", 0.0);
    r.restore_ms = doc.value("restore_ms", 0.0);
    r.total_ms = doc.value("total_ms", 0.0);
    return r;
}

bool container_running(const std::string& id) {
    const std::string podman = find_program("podman");
    if (podman.empty()) return false;
    try {
        const auto c = inspect_container(podman, id);
        return c && c->running;
    } catch (const Error&) {
        return false;
    }
}

std::vector<std::string> list_container_clones() {
    std::vector<std::string> names;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(kContainerStateRoot, ec))
        if (e.is_regular_file()) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
}

std::vector<Removed> destroy_container_clone(const std::string& name) {
    require_root("iprobe clone --destroy");
    validate_name(name);
    const auto clone = load_container_clone(name);
    if (!clone || clone->id.empty()) throw Error("no container clone named '" + name + "'", ExitCode::not_found);
    const std::string podman = podman_path();
    std::vector<Removed> removed;
    if (run({podman, "container", "exists", clone->id}).ok()) {
        RunResult rm = run({podman, "container", "rm", "--force", "--time", "1", clone->id});
        if (!rm.ok() && run({podman, "container", "exists", clone->id}).ok())
            throw Error("podman could not remove clone " + name + ": " + podman_errors(rm));
        removed.push_back({"container", name + " (" + clone->id.substr(0, 12) + ")"});
    }
    if (!clone->network.empty() && run({podman, "network", "exists", clone->network}).ok()) {
        run({podman, "network", "rm", "--force", clone->network});
        removed.push_back({"network", clone->network});
    }
    for (const auto& [_, volume] : clone->volumes)
        if (run({podman, "volume", "exists", volume}).ok()) {
            run({podman, "volume", "rm", "--force", volume});
            removed.push_back({"volume", volume});
        }
    std::error_code ec;
    fs::remove(state_file(name), ec);
    removed.push_back({"state", state_file(name)});
    return removed;
}

}  // namespace iprobe::launcher
