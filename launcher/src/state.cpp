// A clone's recorded state under /run/iprobe/clones/NAME: written atomically
// at each step, read by --destroy, --list and the debug session.
#include "clone_steps.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>

#include "iprobe/support/error.h"
#include "iprobe/support/file.h"

namespace fs = std::filesystem;

namespace iprobe::launcher::clone_steps {

std::string state_dir(const std::string& name) { return std::string(kStateRoot) + "/" + name; }

void write_state_file(const std::string& path, const State& st) {
    std::string text;
    for (const auto& [k, v] : st) text += k + "=" + v + "\n";
    write_file_atomic(path, text.data(), text.size());
}

std::optional<State> read_state_file(const std::string& path) {
    std::ifstream in(path);
    if (!in) return std::nullopt;
    State st;
    std::string line;
    while (std::getline(in, line)) {
        auto eq = line.find('=');
        if (eq != std::string::npos) st[line.substr(0, eq)] = line.substr(eq + 1);
    }
    return st;
}

void save_state(const std::string& name, const State& st) { write_state_file(state_dir(name) + "/state", st); }

State read_state(const std::string& name) {
    auto st = read_state_file(state_dir(name) + "/state");
    if (!st) throw Error("no clone named '" + name + "' (see `iprobe clone --list`)", ExitCode::not_found);
    return *st;
}

pid_t to_pid(const std::string& s) { return s.empty() ? -1 : static_cast<pid_t>(std::stol(s)); }

namespace {

// Who is making the clone, kept from the state so far: its guardian (to
// tell its own clones from later ones of the same name).
State made_by(const std::string& name) {
    State made;
    if (!fs::exists(state_dir(name) + "/state")) return made;
    const State st = read_state(name);
    for (const char* key : {"guardian_pid", "guardian_start"})
        if (auto it = st.find(key); it != st.end()) made[key] = it->second;
    return made;
}

}  // namespace

bool alive_as_recorded(const State& st, const char* pid_key, const char* start_key) {
    const auto pid = st.find(pid_key), start = st.find(start_key);
    return pid != st.end() && start != st.end() && still_running(to_pid(pid->second), start->second);
}

void record_making(const std::string& name, pid_t guardian, const std::string& guardian_start) {
    fs::create_directories(state_dir(name));
    State st;
    st["name"] = name;
    st["launcher_pid"] = std::to_string(::getpid());
    st["launcher_start"] = start_time(::getpid());
    st["guardian_pid"] = std::to_string(guardian);
    st["guardian_start"] = guardian_start;
    save_state(name, st);
}

bool made_here(const State& st) {
    const auto pid = st.find("launcher_pid"), start = st.find("launcher_start");
    return pid != st.end() && start != st.end() && to_pid(pid->second) == ::getpid() &&
           start->second == start_time(::getpid());
}

void record_state(const CloneResult& r, bool created_netns, const std::string& keeper_started, pid_t source) {
    State st = made_by(r.name);
    st["name"] = r.name;
    st["netns"] = r.netns_path;
    st["created_netns"] = std::to_string(created_netns ? 1 : 0);
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

void record_restoring(const std::string& name, const std::string& netns_path, bool created_netns) {
    State st = made_by(name);
    st["name"] = name;
    st["netns"] = netns_path;
    st["created_netns"] = std::to_string(created_netns ? 1 : 0);
    st["launcher_pid"] = std::to_string(::getpid());
    st["launcher_start"] = start_time(::getpid());
    save_state(name, st);
}

bool being_restored(const State& st) {
    return alive_as_recorded(st, "launcher_pid", "launcher_start") ||
           alive_as_recorded(st, "guardian_pid", "guardian_start");
}

std::string scratch_checkpoint_dir(const std::string& name) {
    std::string dir = fs::is_directory("/dev/shm") ? "/dev/shm" : kStateRootParent;
    dir += "/iprobe-checkpoint-";
    dir += name;
    return dir;
}

void remove_tree(const std::string& path) {
    std::error_code ec;
    fs::remove_all(path, ec);
}

}  // namespace iprobe::launcher::clone_steps
