// The clone agent's control protocol (remote.cpp): one JSON object per line,
// a "type" and that message's fields.  Strings are bytes: one that is valid
// UTF-8 travels as a JSON string, any other as {"base64": "..."}, so names,
// paths and messages of any bytes (newlines, quotes, NUL, non-UTF-8) arrive
// exactly as sent.  `file` and `snapshot` are followed by `size` raw bytes.
//   client                                  agent
//   clone {name, shell_job, source_pid} ->
//                                       <- page_server {port}   (CRIU's, on the agent's address)
//   (the dump sends memory to the page server directly)
//   file {name, size} + bytes           ->  an image CRIU kept local
//   snapshot {index, path, size} + bytes ->  a tar of one file snapshot
//   restore                             ->
//                                       <- restored {clone_pid, keeper_pid, restore_us}
//   abort                               ->  (the dump failed: the agent drops it all)
//   destroy {name}                      ->
//                                       <- destroyed
// Any request may be answered with error {exit_code, message}.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <variant>

namespace iprobe::launcher::agent_protocol {

struct Clone {
    std::string name;
    bool shell_job = false;
    pid_t source_pid = -1;
    bool operator==(const Clone&) const = default;
};
struct PageServerReady {
    int port = 0;
    bool operator==(const PageServerReady&) const = default;
};
struct File {
    std::string name;  // an image's file name
    std::uint64_t size = 0;
    bool operator==(const File&) const = default;
};
struct Snapshot {
    std::uint64_t index = 0;
    std::string path;  // the original path the copy stands in for
    std::uint64_t size = 0;
    bool operator==(const Snapshot&) const = default;
};
struct Restore {
    bool operator==(const Restore&) const = default;
};
struct Restored {
    pid_t clone_pid = -1;
    pid_t keeper_pid = -1;
    std::uint64_t restore_us = 0;
    bool operator==(const Restored&) const = default;
};
struct Abort {
    bool operator==(const Abort&) const = default;
};
struct Destroy {
    std::string name;
    bool operator==(const Destroy&) const = default;
};
struct Destroyed {
    bool operator==(const Destroyed&) const = default;
};
// After Restored: the asker has recorded the clone, which now outlives the
// connection.  An agent whose asker closes the connection (or sends anything
// else) first destroys the clone: a killed `iprobe clone --to` leaves none.
struct Keep {
    bool operator==(const Keep&) const = default;
};
struct Kept {
    bool operator==(const Kept&) const = default;
};
struct Failure {
    int exit_code = 1;  // the agent's ExitCode
    std::string message;
    bool operator==(const Failure&) const = default;
};

using Message = std::variant<Clone, PageServerReady, File, Snapshot, Restore, Restored, Abort, Destroy, Destroyed, Keep, Kept,
                             Failure>;

// The message as one line, its newline included.
std::string encode(const Message& message);
// One line (without its newline) as a message; throws Error(bad_input)
// naming what is wrong when it is not one.
Message decode(const std::string& line);

// The message's "type", for errors ("page_server", "restored", ...).
const char* type_name(const Message& message);

}  // namespace iprobe::launcher::agent_protocol
