#include "iprobe/launcher/container.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "criu.h"
#include "iprobe/launcher/clone.h"
#include "iprobe/support/error.h"
#include "process.h"

namespace fs = std::filesystem;

namespace iprobe::launcher {
namespace {

// Which clones are containers, and their IDs: so --destroy removes only
// containers iprobe made.
const char* const kContainerStateRoot = "/run/iprobe/container-clones";

std::string state_file(const std::string& name) { return std::string(kContainerStateRoot) + "/" + name; }

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
// The archive holds production's memory: removed with the directory.
class Workspace {
public:
    explicit Workspace(const Criu& criu) {
        fs::create_directories(kContainerStateRoot);
        char tmpl[] = "/run/iprobe/container-clones/.work-XXXXXX";
        if (!::mkdtemp(tmpl)) throw_errno("creating a work directory under /run/iprobe");
        dir_ = tmpl;
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
    ~Workspace() {
        std::error_code ec;
        fs::remove_all(dir_, ec);
    }
    Workspace(const Workspace&) = delete;
    Workspace& operator=(const Workspace&) = delete;

    std::string archive() const { return dir_ + "/checkpoint.tar"; }
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

double stat_us(const std::string& json, const std::string& key) {
    std::smatch m;
    if (!std::regex_search(json, m, std::regex("\"" + key + "\": *([0-9]+)"))) return 0;
    return std::stod(m[1]);
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
// Returns the network's name; on failure removes the clone and the network.
std::string move_to_own_network(const std::string& podman, const std::string& clone) {
    const std::string network = "iprobe-" + clone;
    run({podman, "network", "rm", "--force", network});  // a remnant of a clone that died with its host
    RunResult networks = run({podman, "container", "inspect", "--format",
                              "{{range $name, $_ := .NetworkSettings.Networks}}{{$name}} {{end}}", clone});
    auto fail = [&](const std::string& what, const RunResult& why) {
        run({podman, "container", "rm", "--force", clone});
        run({podman, "network", "rm", "--force", network});
        throw Error("could not give the clone a network of its own (" + what + "); production is untouched. podman says: " +
                        podman_errors(why),
                    ExitCode::failure);
    };
    if (!networks.ok()) fail("inspect", networks);
    if (RunResult made = run({podman, "network", "create", "--opt", "isolate=true", network}); !made.ok())
        fail("network create", made);
    if (RunResult joined = run({podman, "network", "connect", network, clone}); !joined.ok()) fail("network connect", joined);
    std::istringstream old_networks(networks.out);
    for (std::string name; old_networks >> name;)
        if (RunResult left = run({podman, "network", "disconnect", name, clone}); !left.ok())
            fail("network disconnect " + name, left);
    return network;
}

}  // namespace

ContainerCloneResult clone_container(const ContainerCloneOptions& o) {
    const double t0 = now_ms();
    require_root("iprobe clone --container");
    const std::string podman = podman_path();
    const Criu criu = find_criu();
    RunResult inspect = run({podman, "container", "inspect", "--format", "{{.Id}} {{.State.Running}}", o.container});
    if (!inspect.ok()) throw Error("no podman container '" + o.container + "' (`podman ps` lists them)", ExitCode::not_found);
    std::istringstream fields(inspect.out);
    std::string source_id, running;
    fields >> source_id >> running;
    if (running != "true")
        throw Error("container '" + o.container + "' is not running: there is nothing live to clone", ExitCode::bad_input);

    ContainerCloneResult r;
    r.source = o.container;
    r.name = o.name.empty() ? o.container + "-iprobe-clone" : o.name;
    validate_name(r.name);
    if (run({podman, "container", "exists", r.name}).ok())
        throw Error("a container named '" + r.name + "' exists; remove it with `iprobe clone --destroy " + r.name +
                        "` (if iprobe made it) or pick another --netns name",
                    ExitCode::busy);

    Workspace work(criu);
    progress(o, "checkpointing container " + o.container + " with podman and CRIU " + criu.version +
                    ", production keeps running");
    double t = now_ms();
    // Uncompressed: the archive lives only until the restore, and compressing
    // it (podman's default, zstd) made a 1 GB clone serve after 12.4 s, not 9.9.
    RunResult dump = run(work.podman(podman, {"container", "checkpoint", "--leave-running", "--print-stats",
                                              "--compress", "none", "--export", work.archive(), o.container}));
    r.checkpoint_ms = now_ms() - t;
    if (!dump.ok())
        throw Error("podman could not checkpoint container '" + o.container +
                        "'; production keeps running. podman says: " + podman_errors(dump),
                    ExitCode::failure);
    r.freeze_ms = stat_us(dump.out, "frozen_time") / 1e3;
    r.freezing_ms = stat_us(dump.out, "freezing_time") / 1e3;
    r.pages_written = static_cast<unsigned long long>(stat_us(dump.out, "pages_written"));
    char frozen[64];
    std::snprintf(frozen, sizeof frozen, "production frozen for %.1f ms", r.freeze_ms);
    progress(o, frozen);

    progress(o, "restoring the clone as container " + r.name + " on a network of its own");
    t = now_ms();
    RunResult restore = run(work.podman(podman, {"container", "restore", "--import", work.archive(), "--name", r.name,
                                                 "--ignore-static-ip", "--ignore-static-mac"}));
    r.restore_ms = now_ms() - t;
    if (!restore.ok()) {
        run({podman, "container", "rm", "--force", r.name});
        throw Error("podman could not restore the clone; production is untouched. podman says: " +
                        podman_errors(restore),
                    ExitCode::failure);
    }
    r.network = move_to_own_network(podman, r.name);
    RunResult clone = run({podman, "container", "inspect", "--format",
                           "{{.Id}} {{.State.Pid}} {{(index .NetworkSettings.Networks \"" + r.network + "\").IPAddress}}",
                           r.name});
    std::istringstream cf(clone.out);
    cf >> r.id >> r.clone_pid >> r.address;
    if (!clone.ok() || r.id.empty()) {
        run({podman, "container", "rm", "--force", r.name});
        run({podman, "network", "rm", "--force", r.network});
        throw Error("the restored clone " + r.name + " cannot be inspected: " + podman_errors(clone));
    }
    std::ofstream(state_file(r.name)) << r.id << "\n" << r.network << "\n";
    r.total_ms = now_ms() - t0;
    return r;
}

pid_t container_main_pid(const std::string& container) {
    RunResult r = run({podman_path(), "container", "inspect", "--format", "{{.State.Pid}}", container});
    const pid_t pid = r.ok() ? static_cast<pid_t>(std::atol(r.out.c_str())) : 0;
    if (pid <= 0) throw Error("no running podman container '" + container + "' (`podman ps` lists them)", ExitCode::not_found);
    return pid;
}

bool is_container_clone(const std::string& name) { return fs::exists(state_file(name)); }

std::vector<Removed> destroy_container_clone(const std::string& name) {
    require_root("iprobe clone --destroy");
    validate_name(name);
    std::ifstream in(state_file(name));
    std::string id, network;
    if (!(in >> id)) throw Error("no container clone named '" + name + "'", ExitCode::not_found);
    in >> network;
    const std::string podman = podman_path();
    std::vector<Removed> removed;
    if (run({podman, "container", "exists", id}).ok()) {
        RunResult rm = run({podman, "container", "rm", "--force", "--time", "1", id});
        if (!rm.ok() && run({podman, "container", "exists", id}).ok())
            throw Error("podman could not remove clone " + name + ": " + podman_errors(rm));
        removed.push_back({"container", name + " (" + id.substr(0, 12) + ")"});
    }
    if (!network.empty() && run({podman, "network", "exists", network}).ok()) {
        run({podman, "network", "rm", "--force", network});
        removed.push_back({"network", network});
    }
    std::error_code ec;
    fs::remove(state_file(name), ec);
    removed.push_back({"state", state_file(name)});
    return removed;
}

}  // namespace iprobe::launcher
