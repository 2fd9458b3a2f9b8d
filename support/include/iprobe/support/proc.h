// What /proc says of a process: its mappings, its threads, fields of its
// status and stat files.  One reader each, for every tool.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace iprobe::proc {

struct Mapping {
    std::uint64_t start = 0, end = 0, offset = 0;
    std::string perms;  // "r-xp"
    std::string path;   // empty for anonymous memory; "[heap]", "[stack]", ... for the kernel's
    bool executable() const { return perms.size() > 2 && perms[2] == 'x'; }
    bool shared_writable() const { return perms.size() == 4 && perms[1] == 'w' && perms[3] == 's'; }
    bool file_backed() const { return !path.empty() && path[0] == '/'; }
};

// /proc/PID/maps.  Throws Error(not_found) when it cannot be read (the
// process is gone, or not ours to read).
std::vector<Mapping> read_maps(pid_t pid);

// Thread IDs of /proc/PID/task, sorted; empty when the process is gone.
std::vector<pid_t> threads(pid_t pid);

// The value of a "Key:\tvalue" line of /proc/PID/status (of
// /proc/PID/task/TID/status when `tid` is given), trimmed.
std::optional<std::string> status_field(pid_t pid, std::string_view key, pid_t tid = 0);
// A status field holding numbers, one per PID namespace level (NSpid, NSsid,
// NStgid), outermost first; empty when absent.
std::vector<long> status_numbers(pid_t pid, std::string_view key);

// Field `number` (1-based, as proc(5) counts them) of /proc/PID/stat, or of
// /proc/PID/task/TID/stat when `tid` is given.  The command name may hold
// spaces and parentheses: fields are counted after its last ')'.
std::optional<std::string> stat_field(pid_t pid, int number, pid_t tid = 0);
// The state letter (R, S, D, T, t, Z, X, ...), or 0 when the process is gone.
char state(pid_t pid, pid_t tid = 0);
// A kernel thread (PF_KTHREAD): no user memory, nothing to probe or clone.
bool kernel_thread(pid_t pid);

// The IPv4 TCP sockets the process holds open that listen: address
// (dotted) and port, from /proc/PID/fd and its network namespace's
// /proc/PID/net/tcp.  Empty when none, or the process is gone.
struct Listener {
    std::string address;
    int port = 0;
};
std::vector<Listener> tcp_listeners(pid_t pid);

}  // namespace iprobe::proc
