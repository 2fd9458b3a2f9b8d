// CRIU driven through its own RPC protocol (`criu swrk FD`: one criu_req /
// criu_resp of CRIU's images/rpc.proto per SOCK_SEQPACKET packet, as
// libcriu, runc and crun speak it), and its statistics image read through
// CRIU's stats.proto.  Nothing here reads CRIU's log: the log is only kept
// for the user.  The messages themselves are protoc's code of CRIU's schemas
// (launcher/CMakeLists.txt, iprobe_criu_proto); this interface carries none.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace iprobe::launcher {

// CRIU's stats-dump image (stats_entry.dump of CRIU's stats.proto).
struct DumpStats {
    std::uint64_t freezing_us = 0;  // stopping the tasks
    std::uint64_t frozen_us = 0;    // tasks stopped until resumed
    std::uint64_t memdump_us = 0;
    std::uint64_t memwrite_us = 0;
    std::uint64_t pages_scanned = 0;
    std::uint64_t pages_written = 0;
};

// Parses DIR/stats-dump; throws Error(failure) when absent or malformed.
DumpStats read_dump_stats(const std::string& dir);

// CRIU's answer to one request: criu_resp's success, cr_errno, cr_errmsg.
struct CriuReply {
    bool success = false;
    int cr_errno = 0;       // the errno CRIU recorded, 0 when none
    std::string cr_errmsg;  // CRIU's first error message, "" when none
    // Set when criu ended without answering (exit status, as waitpid's).
    std::optional<int> died_status;
    // CRIU answers with its first error only.  Where it cannot raise its
    // RLIMIT_NOFILE to fs.nr_open (no CAP_SYS_RESOURCE, as in many
    // containers), its first error in a dump is always that harmless one,
    // whatever went wrong after it (a restore's too): set when that holds here.
    bool first_error_is_harmless_rlimit = false;
    // "CRIU's message (errno N: text)", or how criu ended without one.
    std::string describe() const;
};

// The VERSION request's answer (criu_version).
struct CriuVersion {
    int major = 0, minor = 0, sublevel = 0;
    std::string gitid;
    std::string text() const;  // "4.2.1"
    bool at_least(int want_major, int want_minor) const;
};

// Asks `criu` (an executable: the wrapper scripts/setup writes or a system
// criu) for its version; nullopt when it does not run as criu swrk.
std::optional<CriuVersion> query_criu_version(const std::string& criu);

// A dump of production (`criu dump --leave-running` and the options every
// iprobe clone uses: --tcp-close --skip-in-flight --ext-unix-sk --file-locks).
struct DumpRequest {
    pid_t pid = -1;
    std::string images_dir;
    std::string log_path;  // CRIU's log; its directory is CRIU's work directory
    bool shell_job = false;
    int page_server_fd = -1;  // a connection to a page server: memory goes there (--page-server --ps-socket)
    int netns_fd = -1;        // CRIU runs in this network namespace (-1: the caller's)
    // Called on CRIU's "post-dump" notification, production still frozen;
    // CRIU resumes production once it returns.  Empty: no notifications.
    std::function<void()> post_dump;
};
struct DumpOutcome {
    CriuReply reply;
    DumpStats stats;  // when reply.success: CRIU's stats-dump (it writes it in its work directory)
};
DumpOutcome criu_dump(const std::string& criu, const DumpRequest& request);

// A page server receiving one dump into `images_dir` (criu page-server),
// listening on `address` on a port it picks; it ends after that dump.
struct PageServer {
    CriuReply reply;
    pid_t pid = -1;
    int port = 0;
};
PageServer criu_page_server(const std::string& criu, const std::string& images_dir, const std::string& log_path,
                            const std::string& address);

// ---- the restore, made by the keeper (keeper.cpp) as PID 1 of the clone's
// namespaces.  The request is built before the keeper is forked; the keeper
// only passes bytes between criu and its caller.

// RESTORE with the images at descriptor `images_dir_fd` and the log `log_name`
// in the directory at `work_dir_fd` (descriptors of the process that
// will speak to criu), as `criu restore -d --tcp-close --ext-unix-sk
// --file-locks [--shell-job]`.
std::string restore_request(int images_dir_fd, int work_dir_fd, const std::string& log_name, bool shell_job);

// criu swrk, started and spoken to from a forked process: nothing here
// throws or uses protobuf.
struct SwrkChild {
    pid_t pid = -1;
    int socket = -1;  // our end of the SOCK_SEQPACKET pair
};
// Starts `criu swrk 3` with its end of a new socket pair as descriptor 3 and
// `handed_fd` (when >= 0) as descriptor 4, in a process group of its own;
// `in_child` runs before exec (async-signal-safe calls only).
// pid -1 when fork or socketpair failed (errno set).
SwrkChild start_swrk(const std::string& criu, int handed_fd, const std::function<bool()>& in_child = {});
bool send_packet(int socket, const std::string& packet);
// One packet; nullopt when criu closed its end (or on an error).  Waits
// without limit, through EINTR: CRIU must finish what it started.
std::optional<std::string> receive_packet(int socket);

// A RESTORE answer as the keeper relays it: `packet` empty when criu ended
// without answering (`status` then says how).
struct RestoreReply {
    CriuReply reply;
    pid_t restored_pid = -1;
};
RestoreReply parse_restore_reply(const std::string& packet, int status);

}  // namespace iprobe::launcher
